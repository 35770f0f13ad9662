"""The baseline side of bench/overhead.py: a job's ``train(ctx)`` under torchrun, with no Ray at all.

    python -m torch.distributed.run --standalone --nproc_per_node 2 bench/bare_runner.py PLAN.json

PLAN.json is the plan raytrain resolves for the same flags (``raytrain submit ... --dry-run --json``'s
``plan``): the job file, its arguments and the exact DeepSpeed dict. Each process joins a gloo process
group (what Ray Train sets up on CPU workers), imports the job file and calls ``train(ctx)`` with
:class:`BareContext`, a minimal Ray-free context with the API the jobs use. The engine is built by
``raytrain.runtime.worker.engine.build_engine`` (as on raytrain's workers), and ``ctx.report`` is raytrain's own
``raytrain.runtime.worker.reporter.Reporter``, so the context prints the same event lines: rank 0 a ``metrics``
event per ``ctx.report``, every rank ``memory`` events from a ``MemoryMonitor``, and both sides of the
benchmark are parsed by the same ``JobFacts``.
"""
from __future__ import annotations

import copy
import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # raytrain from this checkout when run as a plain script
    sys.path.insert(0, str(ROOT))

from raytrain.config.plan import Plan  # noqa: E402
from raytrain.runtime.worker.reporter import Reporter  # noqa: E402


class BareContext:
    """What ``train(ctx)`` needs, without Ray: rank, device, config, engine, report (events on stdout)."""

    def __init__(self, plan: Plan, *, rank: int, local_rank: int, world_size: int, monitor_interval: float):
        import torch

        self.plan = plan
        self.name = plan.name
        self.args: list[str] = list(plan.job_args)
        self.config: dict[str, Any] = copy.deepcopy(plan.deepspeed)
        self.rank, self.local_rank, self.world_size = rank, local_rank, world_size
        self.dp_rank, self.dp_size, self.tp, self.pp, self.dp = rank, world_size, 1, 1, world_size
        self.device = torch.device("cpu")
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(plan.precision, torch.float32)
        self.micro_batch: int = self.config["train_micro_batch_size_per_gpu"]
        self.grad_accum: int = self.config["gradient_accumulation_steps"]
        self.train_batch: int = plan.train_batch
        self.activation_checkpointing = plan.activation_checkpointing
        self.engine = None
        self.state: dict[str, Any] = {}
        self.start_step = 0
        self.resumed_from: str | None = None
        # raytrain's own reporting (the same step accounting and event lines as ctx.report), minus checkpoints
        self._reporter = Reporter(rank=rank, train_batch=self.train_batch)
        if monitor_interval > 0:
            self._reporter.start_monitor(monitor_interval, gpu=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def log(self, *parts: Any) -> None:
        if self.is_main:
            print(*parts, flush=True)

    def checkpointed(self, fn: Any, *args: Any) -> Any:
        if not self.activation_checkpointing:
            return fn(*args)
        import torch.utils.checkpoint

        return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)

    def deepspeed(self, model: Any, optimizer: Any = None, *, lr: float = 1e-3, lr_scheduler: Any = None,
                  model_parameters: Any = None, **kwargs: Any) -> Any:
        """The engine from the exact resolved DeepSpeed dict; the same default client AdamW as raytrain."""
        from raytrain.runtime.worker.engine import build_engine

        if optimizer is None and "optimizer" not in self.config:
            import torch

            def optimizer(params):
                return torch.optim.AdamW([p for p in params if getattr(p, "requires_grad", True)], lr=lr)

        self.engine = build_engine(model, optimizer=optimizer, config=copy.deepcopy(self.config),
                                   lr_scheduler=lr_scheduler, model_parameters=model_parameters, **kwargs)
        if not os.environ.get("BARE_RUNNER_NO_GUARD"):  # the phase marks raytrain's ctx puts on every engine
            from raytrain.runtime.worker import heartbeat

            heartbeat.instrument(self.engine)
        return self.engine

    def report(self, metrics: dict[str, Any], *, checkpoint: bool | None = None) -> None:
        """The same step accounting as raytrain's ctx.report; the event goes to stdout and nowhere else."""
        self._reporter.report(metrics, engine_step=getattr(self.engine, "global_steps", None), engine=self.engine)

    def finish(self) -> None:
        self._reporter.finish()


def _time_guard() -> list:
    """Wrap the guard's per-step and per-gradient work with a timer: [seconds, steps]."""
    import time

    from raytrain.runtime.worker import guard

    total = [0.0, 0, 0.0]  # seconds in all, steps, seconds in the all-reduce (incl. waiting for the other ranks)

    def timed(name: str, counts: bool = False, owner: Any = guard.StepGuard) -> None:
        inner = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                total[0] += time.perf_counter() - t
                total[1] += counts
                if name == "agree":
                    total[2] += time.perf_counter() - t

        setattr(owner, name, wrapper)

    timed("agree", counts=True)
    timed("note_loss")
    timed("launch_early")
    timed("poisoned", owner=guard)  # under ZeRO 1-3 (guard.zero_skips_non_finite): the per-micro-batch factor
    by_overflow = guard.StepGuard._step_by_overflow

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:  # the step itself is not the guard's time
        result = by_overflow(self, *args, **kwargs)
        total[1] += not getattr(self.engine.optimizer, "overflow", False)  # a skipped one: agree counted it
        return result

    guard.StepGuard._step_by_overflow = counted
    return total


def _start_watch() -> None:
    """What raytrain's heartbeats and straggler watch do, without Ray: each step's compute time (collective
    waits timed, raytrain.runtime.worker.collective_time) and a daemon thread that every heartbeat.BEAT_S takes the
    rank's snapshot and runs the straggler rule on it (the board and the driver's watchdog, both in other
    processes in a raytrain job, here in the training process itself: an upper bound of their cost)."""
    import threading
    import time

    from raytrain import straggler
    from raytrain.runtime.worker import heartbeat

    heartbeat.STATE.training_ident = threading.get_ident()
    heartbeat.STATE.time_compute()
    detector = straggler.Detector()

    def beat() -> None:
        while True:
            time.sleep(heartbeat.BEAT_S)
            snapshot = {**heartbeat.STATE.snapshot(), "rank": 0}
            detector.update([snapshot, {**snapshot, "rank": 1}])

    threading.Thread(target=beat, name="raytrain-heartbeat", daemon=True).start()


def _count_waits() -> list:
    """Count the collective waits the straggler watch times (its cost is two clock reads per wait): [waits]."""
    from torch.distributed.distributed_c10d import Work

    count = [0]
    timed = Work.wait

    def wait(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        count[0] += 1
        return timed(self, *args, **kwargs)

    Work.wait = wait
    return count


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: torchrun --nproc_per_node N bench/bare_runner.py PLAN.json", file=sys.stderr)
        return 2
    document = json.loads(Path(argv[0]).read_text())
    plan = Plan.from_dict(document.get("plan", document))  # a whole `--dry-run --json` document, or just its plan
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch
    import torch.distributed as dist

    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if world != plan.scaling.num_workers:
        print(f"bare_runner: the plan is for {plan.scaling.num_workers} workers, torchrun started {world}",
              file=sys.stderr)
        return 2
    ray_address = os.environ.get("RAYTRAIN_BARE_RAY")
    if ray_address:  # overhead.py --bare-ray: a Ray core worker in this process too, idle (nothing uses it)
        import ray

        ray.init(address=ray_address, _node_ip_address=ray_address.rsplit(":", 1)[0], log_to_driver=False,
                 logging_level="ERROR", configure_logging=False)
        print(f"bare_runner: rank {os.environ.get('RANK', 0)} is a Ray driver of {ray_address}", flush=True)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(minutes=10))
    if os.environ.get("BARE_RUNNER_NO_GUARD"):  # overhead.py --guards-ab's "off" side: the engine without guards
        from raytrain.runtime.worker import guard

        guard.install = lambda engine, **kw: None
    else:  # the "on" side: also the heartbeat and the straggler watch, as on raytrain's workers
        _start_watch()
    guard_time = _time_guard() if os.environ.get("BARE_RUNNER_GUARD_TIMING") else None
    waits = _count_waits() if guard_time is not None and not os.environ.get("BARE_RUNNER_NO_GUARD") else None
    from raytrain.runtime.worker.reporter import MONITOR_INTERVAL_S  # the sampler raytrain's workers run

    ctx = BareContext(plan, rank=rank, local_rank=local_rank, world_size=world, monitor_interval=MONITOR_INTERVAL_S)
    if rank == 0:
        print(f"bare_runner: {world} processes, torch threads {torch.get_num_threads()}, "
              f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}", flush=True)
    from raytrain.runtime.worker.job_import import load_job  # the same import raytrain's workers do

    module = load_job(plan.job_file)  # an absolute path: found directly
    module.train(ctx)
    ctx.finish()
    if guard_time is not None:  # overhead.py --guards-ab: the guard's own seconds, beside the run's step times
        from raytrain.runtime.worker import collective_time

        print(f"bare_runner: rank {rank} guard_s {guard_time[0]:.6f} steps {guard_time[1]} "
              f"agree_s {guard_time[2]:.6f} waits {waits[0] if waits else 0} "
              f"collective_wait_s {collective_time.seconds():.6f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
