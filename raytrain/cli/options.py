"""`raytrain submit`'s option flags, generated from their declarations in raytrain.config.options."""
from __future__ import annotations

from typing import Any, Callable

import click

from raytrain.cli.common import FINITE_FLOAT, address_option
from raytrain.config.options import SPECS, Options, OptionSpec, flag_of, help_of
from raytrain.config.config_file import load_profile

_CLICK_TYPES = {int: click.INT, float: FINITE_FLOAT, bool: click.BOOL, "path": click.Path()}

config_option = click.option(  # the config file itself: not an Options field
    "--config", type=click.Path(), help="YAML/TOML/JSON config file with the same keys; flags win."
)


def click_option(name: str) -> Callable:
    """The Click option declared for Options field ``name``."""
    spec: OptionSpec = SPECS[name]
    flag = flag_of(name)
    kwargs: dict[str, Any] = {"help": help_of(name)}
    if spec.metavar:
        kwargs["metavar"] = spec.metavar
    if spec.choices:
        kwargs["type"] = click.Choice(list(spec.choices))
    elif spec.type is not None:
        kwargs["type"] = _CLICK_TYPES[spec.type]
    if spec.multiple:
        kwargs["multiple"] = True
    if spec.switch:
        return click.option(f"{flag}/--no-{flag[2:]}", name, default=None, **kwargs)
    return click.option(flag, name, **kwargs)


def generated_names() -> list[str]:
    """The Options fields whose Click option comes from the declaration, in declaration order."""
    return [name for name, spec in SPECS.items() if spec.flag and spec.generated]


def submit_options(fn: Callable) -> Callable:
    """Every Options flag of `raytrain submit`, in declaration order (--address first, --config after
    --ds-config)."""
    decorators = [address_option]
    for name in generated_names():
        decorators.append(click_option(name))
        if name == "ds_config":
            decorators.append(config_option)
    for decorator in reversed(decorators):
        fn = decorator(fn)
    return fn


def options_from_flags(job: str | None, job_args: tuple[str, ...], **flags: Any) -> Options:
    """Flags over the --config file; unset flags stay None so later layers can fill them."""
    profile = load_profile(flags["config"]) if flags.get("config") else Options()
    given: dict[str, Any] = {}
    for name, spec in SPECS.items():
        if spec.flag:
            value = flags.get(name)
            given[name] = spec.from_flag(value) if spec.from_flag else value
    return Options(job=job, job_args=list(job_args), **given).merged_over(profile)
