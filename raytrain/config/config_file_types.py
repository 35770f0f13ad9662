"""The type each ``--config`` file key must have, from its declaration in raytrain.config.options.

YAML, TOML and JSON give typed values (``name: 123`` is a number, ``activation-checkpointing: "no"`` a
string). A value of the wrong type is refused naming the file, the key, the value and what would work;
nothing is converted (a quoted "no" is never read as a boolean, whichever way).
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

from raytrain.config.options import SPECS, Options
from raytrain.errors import ConfigError

_SCALARS = (str, int, float)


def _accepted(name: str) -> tuple[type, ...]:
    """The Python types the field's annotation allows (bool, int, float, str, dict, list), None left out."""
    hint = _HINTS[name]
    args = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
        else (hint,)
    out = []
    for arg in args:
        origin = typing.get_origin(arg) or arg
        if origin is not type(None):
            out.append(origin)
    return tuple(out)


_HINTS = typing.get_type_hints(Options)
ACCEPTED: dict[str, tuple[type, ...]] = {f.name: _accepted(f.name) for f in dataclasses.fields(Options)}


def _is(value: Any, kind: type) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:  # a whole number is a number too; nan and inf are not numbers an option can use
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, kind)


def _describe(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, float) and not math.isfinite(value):
        return "not a finite number"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"


def _expected(name: str, key: str) -> str:
    """What would work for ``key``, in the config file's own terms."""
    spec, kinds = SPECS[name], ACCEPTED[name]
    if spec.choices:
        return f"one of {', '.join(map(str, spec.choices))}"
    if bool in kinds:
        return f"true or false, unquoted ({key}: true)"
    if kinds == (dict,):
        return f"a mapping of names to values ({key}: {{NAME: value}})"
    if kinds == (list,):
        return f'a list of strings ({key}: ["--steps", "10"])'
    words = {int: "a whole number", float: "a number", str: "a string"}
    what = " or ".join(words[k] for k in kinds if k in words)
    if spec.type == "path":
        return f'a file path as a string ({key}: "ds.json")'
    if spec.metavar and str in kinds:
        return f"{what} ({spec.metavar})"
    return what


def check_value(path: str, key: str, name: str, value: Any) -> None:
    """Refuse a config file value whose type the option's declaration does not allow."""
    kinds = ACCEPTED[name]
    ok = any(_is(value, kind) for kind in kinds)
    if ok and dict in kinds:
        ok = all(isinstance(v, _SCALARS) and not isinstance(v, bool) for v in value.values())
    if ok and list in kinds:
        ok = all(isinstance(v, _SCALARS) and not isinstance(v, bool) for v in value)
    if ok and SPECS[name].choices and value not in SPECS[name].choices:
        ok = False
    if not ok:
        raise ConfigError(
            f"--config {path}: {key}: {value!r} is {_describe(value)}; expected {_expected(name, key)}",
            flag="--config",
        )
