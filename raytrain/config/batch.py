"""Batch arithmetic: train_batch = micro-batch x grad-accum x data-parallel size; derive what is missing.

An elastic ``--workers MIN-MAX`` must keep the global batch at every size in the range (the worker runtime
changes grad-accum per size). Every error names where the value came from (a flag, or a ``--ds-config``
key: ``origins``) and suggests a global batch that passes all of these checks.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from raytrain.config.elastic import accum_for
from raytrain.config.options import DEFAULTS, Options, flag_of
from raytrain.errors import ConfigError

SEARCH = 100_000  # how far from the given global batch a suggestion is looked for


@dataclass(frozen=True)
class Origin:
    """A value taken from a DeepSpeed config: ``where`` (``--ds-config ds.json``), its key and its flag."""

    where: str
    key: str
    flag: str = "--ds-config"


@dataclass(frozen=True)
class Sources:
    """Where the batch options came from: a flag (the default) or a DeepSpeed config key."""

    origins: dict[str, Origin] = field(default_factory=dict)

    def label(self, name: str) -> str:
        o = self.origins.get(name)
        return f"{o.where}: {o.key}" if o else flag_of(name)

    def flag(self, name: str) -> str:
        o = self.origins.get(name)
        return o.flag if o else flag_of(name)

    def set_to(self, name: str, value: int) -> str:
        o = self.origins.get(name)
        return f"{o.key} {value} in {o.where}" if o else f"{flag_of(name)} {value}"

    def drop(self, name: str) -> str:
        o = self.origins.get(name)
        return f"drop {o.key} from {o.where}" if o else f"drop {flag_of(name)}"


def _derived(total: int, micro: int | None, accum: int | None, dp: int) -> tuple[int, int] | None:
    """(micro, accum) for global batch ``total`` at data-parallel size ``dp``; None if impossible."""
    if micro is None and accum is None:
        micro = DEFAULTS["micro_batch"]
    if accum is None:
        return None if total % (micro * dp) else (micro, total // (micro * dp))
    if micro is None:
        return None if total % (accum * dp) else (total // (accum * dp), accum)
    return (micro, accum) if micro * accum * dp == total else None


def _fits(total: int, micro: int | None, accum: int | None, sizes: range) -> bool:
    derived = _derived(total, micro, accum, sizes.stop - 1)
    return derived is not None and all(accum_for(total, derived[0], n) is not None for n in sizes)


def suggestion(total: int, micro: int | None, accum: int | None, sizes: range) -> tuple[int, bool] | None:
    """(a global batch nearest ``total`` that passes every check, whether grad-accum must be left open for
    it); None if there is none near."""
    for keep_accum in ((True, False) if accum is not None else (True,)):
        a = accum if keep_accum else None
        for distance in range(SEARCH):
            for candidate in (total - distance, total + distance):
                if candidate >= 1 and _fits(candidate, micro, a, sizes):
                    return candidate, not keep_accum
    return None


def _refuse(problem: str, total: int, micro: int | None, accum: int | None, sizes: range, src: Sources,
            flag: str, alternative: str = "") -> ConfigError:
    """The error for ``problem``, with a global batch that passes every check when given back."""
    found = suggestion(total, micro, accum, sizes)
    if found:
        value, drop_accum = found
        problem += f"; use {src.set_to('train_batch', value)}"
        if drop_accum:
            problem += f" and {src.drop('grad_accum')} (raytrain then derives it)"
    return ConfigError(problem + alternative, flag=flag)


def _check_elastic(total: int, micro: int, given: tuple[int | None, int | None], sizes: range,
                   src: Sources) -> None:
    """Every size in ``sizes`` keeps ``total`` at ``micro``; ``given``: (micro, accum) as the user gave them,
    for a suggestion that passes when given back with them."""
    bad = [n for n in sizes if accum_for(total, micro, n) is None]
    if not bad:
        return
    good = [n for n in sizes if n not in bad]
    lo, hi = sizes.start, sizes.stop - 1
    problem = (
        f"--workers {lo}-{hi}: the global batch {total} (micro-batch {micro}) cannot be kept with "
        f"{', '.join(map(str, bad))} worker(s) ({total} is not divisible by micro-batch x workers)"
    )
    alternative = f", or a range whose sizes all divide it (these do: {', '.join(map(str, good))})" if good else ""
    raise _refuse(problem, total, *given, sizes, src, "--workers", alternative)


def batch_sizes(opts: Options, dp: int, min_dp: int | None = None, sources: Sources | None = None
                ) -> tuple[int, int, int]:
    """(micro, accum, train_batch) with train_batch = micro x accum x dp. The defaults apply here, not
    before: which of the three the user left open decides what is derived. ``min_dp``: an elastic range's
    smallest data-parallel size (every size from it to ``dp`` must keep the global batch)."""
    src = sources or Sources()
    micro, accum, total = opts.micro_batch, opts.grad_accum, opts.train_batch
    for name, value in (("micro_batch", micro), ("grad_accum", accum), ("train_batch", total)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{src.label(name)} {value!r}: must be an integer >= 1", flag=src.flag(name))
    sizes = range(min_dp or dp, dp + 1)
    if total is None:
        micro = micro or DEFAULTS["micro_batch"]
        given_accum = accum
        accum = accum or DEFAULTS["grad_accum"]
        total = micro * accum * dp
        _check_elastic(total, micro, (opts.micro_batch, given_accum), sizes, src)
        return micro, accum, total
    derived = _derived(total, micro, accum, dp)
    if derived is None:
        raise _refuse(_mismatch(total, micro, accum, dp, src), total, micro, accum, sizes, src,
                      src.flag("train_batch"))
    _check_elastic(total, derived[0], (micro, accum), sizes, src)
    return derived[0], derived[1], total


def _mismatch(total: int, micro: int | None, accum: int | None, dp: int, src: Sources) -> str:
    what = src.label("train_batch")
    if micro is not None and accum is not None:
        return (f"{what} {total} != micro-batch {micro} x grad-accum {accum} x data-parallel size {dp} "
                f"= {micro * accum * dp}")
    if accum is None:
        micro = micro or DEFAULTS["micro_batch"]
        return f"{what} {total} is not divisible by micro-batch {micro} x data-parallel size {dp} = {micro * dp}"
    return f"{what} {total} is not divisible by grad-accum {accum} x data-parallel size {dp} = {accum * dp}"
