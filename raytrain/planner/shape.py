"""What the planner needs to know about a model, from numbers a user types (``--params 7e9 --layers 32 ...``).

A ``ModelShape`` comes either from :func:`shape_from_numbers` (the flags) or from
:func:`raytrain.planner.meta.inspect_model` (a job's model built on the meta device). Fields that could not
be known stay None, and ``notes`` says what was assumed instead.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from raytrain.errors import ConfigError
from raytrain.planner.memory import default_heads, transformer_params


@dataclass(frozen=True)
class ModelShape:
    params: int
    largest_layer: int  # parameters of the module with most parameters of its own (DeepSpeed's definition)
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    vocab: int | None = None
    largest_layer_name: str | None = None
    trainable: int | None = None  # parameters that train (None: all); the rest are frozen (e.g. a LoRA base)
    source: str = "flags"
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["notes"] = list(self.notes)
        return d

    def with_overrides(self, **values) -> "ModelShape":
        """This shape with every given (non-None) value replacing the inferred one."""
        given = {k: v for k, v in values.items() if v is not None}
        return replace(self, **given) if given else self


def _positive(value, flag: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{flag} {value}: must be a whole number >= 1", flag=flag)
    return value


def check_shape_numbers(
    *, layers=None, hidden=None, heads=None, vocab=None, largest_layer=None, seq=None, micro_batch=None
) -> None:
    """Raise ConfigError naming the flag for any number that cannot describe a model."""
    for value, flag in (
        (layers, "--layers"), (hidden, "--hidden"), (heads, "--heads"), (vocab, "--vocab"),
        (largest_layer, "--largest-layer"), (seq, "--seq"), (micro_batch, "--micro-batch"),
    ):
        _positive(value, flag)
    if hidden and heads and hidden % heads:
        raise ConfigError(
            f"--heads {heads}: must divide --hidden {hidden} (head size = hidden / heads)", flag="--heads"
        )


def shape_from_numbers(
    params: int | None = None,
    *,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    vocab: int | None = None,
    largest_layer: int | None = None,
    seq: int | None = None,
) -> ModelShape:
    """A ModelShape from the ``--params/--layers/--hidden/--heads/--vocab/--largest-layer`` numbers.

    - params: required, unless --layers and --hidden give it as ``12*L*h^2 + 13*L*h (+ (V + s)*h)``.
    - largest layer: --largest-layer; else the bigger of a GPT block's MLP up-projection ``4h^2 + 4h`` and the
      embedding ``V*h``; else, from --layers alone, a third of one layer (``P / (3L)``); else the whole model
      (an upper bound on the ZeRO-3 working set).
    - heads: --heads; else 128-wide heads (``hidden // 128``).
    """
    check_shape_numbers(layers=layers, hidden=hidden, heads=heads, vocab=vocab, largest_layer=largest_layer, seq=seq)
    notes: list[str] = []
    if params is None:
        if not (layers and hidden):
            raise ConfigError(
                "--params: give the parameter count (e.g. --params 7e9), or --layers and --hidden, "
                "or a job file that defines model(args)",
                flag="--params",
            )
        params = transformer_params(layers, hidden, vocab, seq)
        notes.append(f"parameters from --layers/--hidden: 12*L*h^2 + 13*L*h{' + (V+s)*h' if vocab else ''}")
    elif isinstance(params, bool) or not isinstance(params, int) or params < 1:
        raise ConfigError(f"--params {params}: must be a count >= 1 (e.g. 7e9)", flag="--params")
    if largest_layer is None:
        if hidden:
            largest_layer = max(4 * hidden * hidden + 4 * hidden, (vocab or 0) * hidden)
            notes.append("largest layer: a GPT MLP projection 4h^2+4h" + (" or the embedding V*h" if vocab else ""))
        elif layers:
            largest_layer = max(1, params // (3 * layers))
            notes.append("largest layer: P/(3L), a third of one layer (give --hidden or --largest-layer)")
        else:
            largest_layer = params
            notes.append("largest layer unknown: the whole model (an upper bound for ZeRO-3)")
    largest_layer = min(largest_layer, params)
    if hidden and heads is None:
        heads = default_heads(hidden)
        notes.append(f"heads: {heads} (128-wide heads; give --heads)")
    return ModelShape(
        params=params, largest_layer=largest_layer, layers=layers, hidden=hidden, heads=heads, vocab=vocab,
        source="flags", notes=tuple(notes),
    )
