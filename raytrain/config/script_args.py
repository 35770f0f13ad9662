"""Script mode's command line (pure: used by the CLI to merge a user's DeepSpeed config, and by the workers).

A launcher-style script receives its DeepSpeed config as ``--deepspeed_config PATH`` (DeepSpeed's
``add_config_arguments``; ``--deepscale_config`` is its deprecated alias) or, in Hugging Face scripts,
``--deepspeed PATH.json``. When the user already gives one in SCRIPT_ARGS, raytrain merges its flags into
that file's contents (the same rules as ``--ds-config``) and the workers get the merged copy in its place.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

CONFIG_FLAGS = ("--deepspeed_config", "--deepscale_config")
HF_FLAG = "--deepspeed"  # Hugging Face TrainingArguments: --deepspeed takes the config path


@dataclass(frozen=True)
class ConfigArg:
    flag: str  # the option as the user wrote it
    path: str  # its value
    index: int  # the token holding the value (``--flag=PATH`` or the PATH after ``--flag``)
    inline: bool  # ``--flag=PATH``


def options_end(args: list[str]) -> int:
    """Options end at a bare ``--`` (argparse treats what follows as positionals)."""
    return args.index("--") if "--" in args else len(args)


def find_config_args(args: list[str]) -> list[ConfigArg]:
    """Every DeepSpeed config path the user passes in SCRIPT_ARGS (argparse uses the last one)."""
    found = []
    end = options_end(args)
    i = 0
    while i < end:
        token = args[i]
        name, eq, value = token.partition("=")
        if name in CONFIG_FLAGS:
            if eq:
                found.append(ConfigArg(name, value, i, True))
            elif i + 1 < end:
                found.append(ConfigArg(name, args[i + 1], i + 1, False))
                i += 1
        elif name == HF_FLAG:
            # ``--deepspeed`` is a switch in DeepSpeed's own arguments and a path in Hugging Face's: only
            # a value that names a JSON file is a config.
            if eq and value.endswith(".json"):
                found.append(ConfigArg(name, value, i, True))
            elif not eq and i + 1 < end and not args[i + 1].startswith("-") and args[i + 1].endswith(".json"):
                found.append(ConfigArg(name, args[i + 1], i + 1, False))
                i += 1
        i += 1
    return found


def find_config_arg(args: list[str]) -> ConfigArg | None:
    """The DeepSpeed config the script would read (the last one given), or None."""
    found = find_config_args(list(args))
    return found[-1] if found else None


def replace_config_args(args: list[str], path: str) -> list[str]:
    """``args`` with every DeepSpeed config path given in them replaced by ``path``."""
    out = list(args)
    for arg in find_config_args(out):
        out[arg.index] = f"{arg.flag}={path}" if arg.inline else path
    return out


def gives_option(args: list[str], *names: str) -> bool:
    """Whether ``args`` contain one of the options ``names`` (``--name`` or ``--name=VALUE``)."""
    end = options_end(list(args))
    return any(token.partition("=")[0] in names for token in list(args)[:end])


def mentions(path: Path, *words: str, packages: bool = True, limit: int = 1 << 20) -> bool:
    """Whether the script, or a module beside it that it imports (one level; with ``packages`` also a package
    folder beside it), mentions any of ``words``."""

    def in_file(file: Path) -> bool:
        try:
            return file.stat().st_size <= limit and any(w in file.read_text(errors="replace") for w in words)
        except OSError:
            return False

    if in_file(path):
        return True
    try:
        tree = ast.parse(path.read_text(errors="replace"))
    except (OSError, SyntaxError, ValueError):
        return False
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    for name in sorted(names):
        module, package = path.parent / f"{name}.py", path.parent / name
        if in_file(module):
            return True
        if packages and package.is_dir() and any(in_file(f) for f in sorted(package.glob("*.py"))):
            return True
    return False
