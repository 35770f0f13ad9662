"""Reading sizes and counts as users type them, and printing bytes.

Sizes follow the units written: ``80GB`` = 80e9 bytes, ``80GiB`` = 80 * 2**30 bytes, a bare number is GB.
(GPU vendors' "80GB" cards hold 80 GiB or a little less; taking GB is the cautious reading.) The planner
prints decimal GB, the unit of the ZeRO paper's figures.
"""
from __future__ import annotations

import re

from raytrain.errors import ConfigError

GB = 1e9

_SIZE_UNITS = {
    "": GB, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_COUNT_SUFFIX = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_NUMBER = r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)"


def parse_size(text: str | float | int, flag: str) -> int:
    """``80GB``, ``80 GiB``, ``141g``, ``80`` (GB) -> bytes. Raises ConfigError naming ``flag``."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, unit = float(text), ""
    else:
        m = re.fullmatch(_NUMBER + r"\s*([a-z]*)", str(text).strip().lower())
        if not m or m.group(2) not in _SIZE_UNITS:
            raise ConfigError(
                f"{flag} {text}: expected a size such as 80GB, 80GiB or 80 (GB)", flag=flag
            )
        value, unit = float(m.group(1)), m.group(2)
    size = value * _SIZE_UNITS[unit]
    if size <= 0:
        raise ConfigError(f"{flag} {text}: must be more than 0", flag=flag)
    return int(size)


def parse_count(text: str | float | int, flag: str) -> int:
    """``7e9``, ``7B``, ``6.7b``, ``350M``, ``125k`` -> an integer count. Raises ConfigError naming ``flag``."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value, suffix = float(text), ""
    else:
        m = re.fullmatch(_NUMBER + r"\s*([a-z]?)", str(text).strip().lower())
        if not m or m.group(2) not in _COUNT_SUFFIX:
            raise ConfigError(f"{flag} {text}: expected a count such as 7e9, 7B or 350M", flag=flag)
        value, suffix = float(m.group(1)), m.group(2)
    count = int(round(value * _COUNT_SUFFIX[suffix]))
    if count <= 0:
        raise ConfigError(f"{flag} {text}: must be more than 0", flag=flag)
    return count


def gb(nbytes: float | None, digits: int = 1) -> str:
    """Bytes as decimal GB for tables: ``31.4``; ``-`` for None."""
    if nbytes is None:
        return "-"
    value = nbytes / GB
    if 0 < value < 10 ** -digits:
        return f"{value:.{digits}g}" if value >= 1e-3 else "<0.001"
    return f"{value:.{digits}f}"


def human_count(n: int | None) -> str:
    """``7241732096`` -> ``7.24B``."""
    if n is None:
        return "-"
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.3g}{suffix}"
    return str(n)
