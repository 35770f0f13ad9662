"""A ``--config`` file (YAML/TOML/JSON): Options by their config-file keys. (A cluster *profile* is
``cluster up --profile``'s file: raytrain.clusters.profiles.)"""
from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from raytrain.config.options import SPECS, Options
from raytrain.config.config_file_types import check_value
from raytrain.errors import ConfigError

# Path options (ds_config, tp_spec): a relative path in a config file is relative to the file.
PATH_KEYS = tuple(name for name, spec in SPECS.items() if spec.type == "path")


def _read(p: Path, path: str | Path) -> Any:
    text = p.read_text()
    try:
        if p.suffix == ".toml":
            return tomllib.loads(text)
        if p.suffix == ".json":
            return json.loads(text)
        import yaml

        return yaml.safe_load(text) or {}
    except Exception as exc:  # every parser has its own error type
        raise ConfigError(f"--config {path}: cannot parse: {exc}", flag="--config") from exc


def load_profile(path: str | Path) -> Options:
    """Read a ``--config`` file (.yaml/.yml/.toml/.json) whose keys are Options fields."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--config {path}: no such file", flag="--config")
    data = _read(p, path)
    if not isinstance(data, dict):
        raise ConfigError(f"--config {path}: expected a mapping of option names to values", flag="--config")
    if isinstance(data.get("submit"), dict):  # allow a [submit] table / submit: section
        data = data["submit"]
    values: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in SPECS:
            known = ", ".join(sorted(k.replace("_", "-") for k in SPECS))
            raise ConfigError(f"--config {path}: unknown key {key!r}; known keys: {known}", flag="--config")
        check_value(str(path), str(key), name, value)
        values[name] = [str(v) for v in value] if name == "job_args" else value
    for key in PATH_KEYS:
        if values.get(key) and not Path(values[key]).is_absolute():
            values[key] = str((p.parent / values[key]).resolve())
    return Options(**values)
