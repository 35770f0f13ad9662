"""Value checks shared by the resolution steps; each error names the option as its declaration does."""
from __future__ import annotations

import math
from typing import Any

from raytrain.config.options import flag_of
from raytrain.errors import ConfigError


def check_int(name: str, value: Any, minimum: int) -> int:
    """Option ``name``'s value as an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        flag = flag_of(name)
        raise ConfigError(f"{flag} {value!r}: must be an integer >= {minimum}", flag=flag)
    return value


def check_number(name: str, value: Any, minimum: float, strict: bool) -> float:
    """Option ``name``'s value as a number > ``minimum`` (``strict``) or >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or (
        value <= minimum if strict else value < minimum
    ):
        flag = flag_of(name)
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise ConfigError(f"{flag} {value!r}: must be a finite number {bound}", flag=flag)
    return float(value)
