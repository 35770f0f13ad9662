"""Batch arithmetic: train_batch = micro-batch x grad-accum x data-parallel size; derive what is missing."""
from __future__ import annotations

from raytrain.config.checks import check_int
from raytrain.config.options import DEFAULTS, Options
from raytrain.errors import ConfigError


def _derive(total: int, micro: int | None, accum: int | None, dp: int) -> tuple[int, int]:
    """(micro, accum) for a given global batch ``total`` at data-parallel size ``dp``."""
    if micro is None and accum is None:
        micro = DEFAULTS["micro_batch"]
    if accum is None:
        if total % (micro * dp):
            raise ConfigError(
                f"--train-batch {total} is not divisible by micro-batch {micro} x data-parallel size {dp} "
                f"= {micro * dp}; use a multiple of {micro * dp} (e.g. {max(1, total // (micro * dp)) * micro * dp})",
                flag="--train-batch",
            )
        return micro, total // (micro * dp)
    if micro is None:
        if total % (accum * dp):
            raise ConfigError(
                f"--train-batch {total} is not divisible by grad-accum {accum} x data-parallel size {dp} "
                f"= {accum * dp}; use a multiple of {accum * dp}",
                flag="--train-batch",
            )
        return total // (accum * dp), accum
    if micro * accum * dp != total:
        raise ConfigError(
            f"--train-batch {total} != micro-batch {micro} x grad-accum {accum} x data-parallel size {dp} "
            f"= {micro * accum * dp}; drop --train-batch or make them agree",
            flag="--train-batch",
        )
    return micro, accum


def batch_sizes(opts: Options, dp: int) -> tuple[int, int, int]:
    """(micro, accum, train_batch) with train_batch = micro x accum x dp. The defaults apply here, not
    before: which of the three the user left open decides what is derived."""
    micro, accum, total = opts.micro_batch, opts.grad_accum, opts.train_batch
    if micro is not None:
        check_int("micro_batch", micro, 1)
    if accum is not None:
        check_int("grad_accum", accum, 1)
    if total is None:
        micro = micro or DEFAULTS["micro_batch"]
        accum = accum or DEFAULTS["grad_accum"]
        return micro, accum, micro * accum * dp
    check_int("train_batch", total, 1)
    micro, accum = _derive(total, micro, accum, dp)
    return micro, accum, total
