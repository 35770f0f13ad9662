"""Stragglers: a rank consistently slower than the others (pure: no Ray, no torch; the driver's watchdog feeds
it the heartbeats, raytrain.runtime.driver.hang_watch).

Each rank measures its compute time per step (raytrain.runtime.worker.collective_time): the step's wall-clock time
minus the time its training thread spent blocked in a collective's wait and in checkpointing. A fast rank waits
in the collectives for a slow one, so the slow rank's compute time stays high and the others' drops.

The rule, over the last WINDOW steps that every rank has reported: at a step, a rank is slow when its compute
time is more than RATIO x the median of the other ranks' and at least MIN_EXCESS_S more (scheduler noise on
millisecond steps is not a straggler). A rank slow in at least RAISE_IN of the WINDOW steps is a straggler;
it has recovered when it is slow in at most CLEAR_IN of them (the gap keeps a borderline rank from flapping).
The first WARMUP_STEPS steps a worker group reports are not judged: ranks warm up unevenly (caches, allocator,
the other processes a worker starts), which is no straggler.
"""
from __future__ import annotations

from typing import Any, Iterable

RATIO = 1.5
WINDOW = 10
RAISE_IN = 8
CLEAR_IN = 2
MIN_EXCESS_S = 0.01
WARMUP_STEPS = 20
EXACT_UP_TO = 16  # above this many ranks "the others' median" is everyone's (one rank barely moves it): O(ranks)
HISTORY = 256  # steps kept per rank: beats of two ranks come up to a beat interval apart


def _median(values: list[float]) -> float:
    values = sorted(values)
    n = len(values)
    return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2


def slow_counts(history: dict[int, dict[int, float]], upto: int | None = None, after: int | None = None
                ) -> tuple[dict[int, int], dict[int, float], list[int]]:
    """(rank -> steps slow in the window, rank -> median ratio to the others over the window, the window's
    steps): the last WINDOW steps every rank reported (after step ``after``, up to step ``upto``). Empty until
    there are WINDOW such steps (or with fewer than two ranks)."""
    ranks = sorted(history)
    if len(ranks) < 2:
        return {}, {}, []
    common = set.intersection(*(set(history[r]) for r in ranks))
    window = sorted(s for s in common if (upto is None or s <= upto) and (after is None or s > after))[-WINDOW:]
    if len(window) < WINDOW:
        return {}, {}, []
    counts = {r: 0 for r in ranks}
    ratios: dict[int, list[float]] = {r: [] for r in ranks}
    for step in window:
        everyone = _median([history[r][step] for r in ranks]) if len(ranks) > EXACT_UP_TO else None
        for r in ranks:
            mine = history[r][step]
            others = everyone if everyone is not None else _median([history[o][step] for o in ranks if o != r])
            ratios[r].append(mine / others if others > 0 else float("inf"))
            if mine > RATIO * others and mine - others >= MIN_EXCESS_S:
                counts[r] += 1
    return counts, {r: round(_median(v), 2) for r, v in ratios.items()}, window


class Detector:
    """Keeps each rank's recent compute times; ``update`` returns the episodes that start or end."""

    def __init__(self) -> None:
        self.history: dict[int, dict[int, float]] = {}
        self.nodes: dict[int, str] = {}
        self.active: dict[int, dict[str, Any]] = {}  # rank -> its straggler event (the episode)
        self.first: dict[int, int] = {}  # rank -> the first step it reported (warm-up counts from there)

    def add(self, rank: int, compute: Iterable[Any], node: str | None = None) -> None:
        """``compute``: [step, seconds] pairs (any order, repeats fine)."""
        steps = self.history.setdefault(int(rank), {})
        for step, seconds in compute:
            steps[int(step)] = float(seconds)
            self.first[int(rank)] = min(self.first.get(int(rank), int(step)), int(step))
        if len(steps) > HISTORY:
            for step in sorted(steps)[:len(steps) - HISTORY]:
                del steps[step]
        if node:
            self.nodes[int(rank)] = node

    def reset(self) -> list[dict[str, Any]]:
        """A new worker group (a restart): its steps and ranks start afresh; open episodes end (the events)."""
        out = []
        for rank, episode in sorted(self.active.items()):
            event = {"state": "recovered", "rank": rank, "node": episode.get("node"), "step": None,
                     "message": f"rank {rank}: straggler alarm cleared (the workers restarted)"}
            out.append(event)
        self.history, self.nodes, self.active, self.first = {}, {}, {}, {}
        return out

    def warm_after(self) -> int | None:
        """Steps up to this one are warm-up (not judged)."""
        return max(self.first.values()) + WARMUP_STEPS - 1 if self.first else None

    def update(self, beats: Iterable[dict] = ()) -> list[dict[str, Any]]:
        """Feed the latest heartbeats; the straggler events to emit (state "slow" or "recovered")."""
        for beat in beats:
            if beat.get("rank") is not None and beat.get("compute"):
                self.add(beat["rank"], beat["compute"], beat.get("node"))
        counts, ratios, window = slow_counts(self.history, after=self.warm_after())
        out = []
        for rank in sorted(set(counts) | set(self.active)):
            slow = counts.get(rank)
            if rank not in self.active and slow is not None and slow >= RAISE_IN:
                event = {"state": "slow", "rank": rank, "node": self.nodes.get(rank), "ratio": ratios[rank],
                         "slow_steps": slow, "window": len(window), "step": window[-1],
                         "since_step": self.first_held(rank, window[-1])}
                event["message"] = describe(event)
                self.active[rank] = event
                out.append(event)
            elif rank in self.active and slow is not None and slow <= CLEAR_IN:
                event = {"state": "recovered", "rank": rank, "node": self.active[rank].get("node"),
                         "ratio": ratios.get(rank), "step": window[-1] if window else None}
                event["message"] = describe(event)
                del self.active[rank]
                out.append(event)
        return out


    def first_held(self, rank: int, last: int) -> int:
        """The first step (up to ``last``) whose window already made ``rank`` a straggler: when the data said so
        (the event itself waits for the next beat and poll)."""
        ends = sorted(set.intersection(*(set(h) for h in self.history.values())))
        for end in ends:
            if end <= last:
                counts, _, _ = slow_counts(self.history, upto=end, after=self.warm_after())
                if counts.get(rank, 0) >= RAISE_IN:
                    return end
        return last


def describe(event: dict) -> str:
    """``rank 1 (10.0.0.2) is a straggler: compute 2.0x the other ranks' in 9 of the last 10 steps``."""
    who = f"rank {event.get('rank')}" + (f" ({event['node']})" if event.get("node") else "")
    if event.get("state") == "recovered":
        return f"{who} recovered: no longer a straggler" + (f" (step {event['step']})" if event.get("step") else "")
    return (f"{who} is a straggler: compute {event.get('ratio')}x the other ranks' in {event.get('slow_steps')} of "
            f"the last {event.get('window')} steps (to step {event.get('step')})")
