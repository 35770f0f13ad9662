"""Hugging Face models in ``train(ctx)`` jobs (worker side): what a checkpoint records about one (its config,
class and PEFT adapter config, so ``raytrain export --format hf`` can rebuild it; a PEFT model's adapter as
PEFT's own files), and ``ctx.zero_init()``.

transformers and peft are looked up only when the job already imported them (``sys.modules``): a job that
uses neither pays nothing."""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any, Iterator

_HF_CONFIGS: list[Any] = []  # HfDeepSpeedConfig objects zero_init made (transformers only keeps a weakref)


def _peft_model(model: Any) -> Any:
    peft = sys.modules.get("peft")
    if peft is not None and isinstance(model, peft.PeftModel):
        return model
    return None


def _pretrained(model: Any) -> Any:
    transformers = sys.modules.get("transformers")
    if transformers is not None and isinstance(model, transformers.PreTrainedModel):
        return model
    return None


def describe(model: Any) -> dict | None:
    """What an export needs to rebuild ``model`` from its state_dict: ``{"architecture", "config",
    "adapter"}`` (adapter: the PEFT config of the active adapter, or None); None for a model that is not a
    transformers ``PreTrainedModel`` (or a PEFT model around one)."""
    peft_model = _peft_model(model)
    adapter = None
    base = model
    if peft_model is not None:
        base = peft_model.get_base_model()
        peft_config = peft_model.peft_config[peft_model.active_adapter]
        adapter = peft_config.to_dict()
        adapter["peft_type"] = str(getattr(adapter.get("peft_type"), "value", adapter.get("peft_type")))
        adapter["task_type"] = str(getattr(adapter.get("task_type"), "value", adapter.get("task_type")))
        adapter = _jsonable(adapter)
    if _pretrained(base) is None:
        return None
    return {"architecture": type(base).__name__, "config": base.config.to_dict(), "adapter": adapter}


def _jsonable(value: Any) -> Any:
    """PEFT configs hold sets (target_modules) and enums: JSON values."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [_jsonable(v) for v in value]
        return sorted(items, key=str) if isinstance(value, (set, frozenset)) else items
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(getattr(value, "value", value))


ADAPTER_WEIGHTS = "adapter_model.safetensors"


def save_adapter(model: Any, directory: str | Path, *, rank: int) -> bool:
    """A PEFT model's active adapter as PEFT's own files in ``directory`` (rank 0): ``adapter_config.json`` +
    ``adapter_model.safetensors``, which ``PeftModel.from_pretrained(base, directory)`` loads. Under ZeRO-3 the
    trainable parameters (the adapter: small) are gathered first, a collective: every rank calls this.
    Returns whether ``model`` has an adapter."""
    peft_model = _peft_model(model)
    if peft_model is None:
        return False
    trainable = [(name, p) for name, p in peft_model.named_parameters() if p.requires_grad]
    gathered: Any = contextlib.nullcontext()
    if any(hasattr(p, "ds_id") for _, p in trainable):  # ZeRO-3 partitioned
        import deepspeed

        gathered = deepspeed.zero.GatheredParameters([p for _, p in trainable], modifier_rank=None)
    with gathered:
        state = {name: p.detach().float().cpu().clone() for name, p in trainable} if rank == 0 else {}
    if rank == 0:
        import peft
        from safetensors.torch import save_file

        name = peft_model.active_adapter
        weights = peft.get_peft_model_state_dict(peft_model, state_dict=state, adapter_name=name)
        save_file({k: v.contiguous() for k, v in weights.items()}, str(Path(directory) / ADAPTER_WEIGHTS),
                  metadata={"format": "pt"})
        peft_model.peft_config[name].save_pretrained(str(directory))
    return True


@contextlib.contextmanager
def zero_init(config: dict) -> Iterator[None]:
    """Under ZeRO-3: modules built inside are partitioned as they are built (DeepSpeed ``zero.Init`` with
    the run's config), and transformers is told ZeRO-3 is on (``HfDeepSpeedConfig``), so
    ``from_config``/``from_pretrained`` build and load partitioned too. Below ZeRO-3: nothing."""
    if int((config.get("zero_optimization") or {}).get("stage", 0)) != 3:
        yield
        return
    import deepspeed
    import torch._dynamo  # noqa: F401  first imported inside zero.Init (transformers' model modules import it),
    # its polyfills check torch.Tensor.__new__, which zero.Init replaces: "TypeError: Signature mismatch"

    from raytrain.runtime.worker.engine import ensure_distributed

    ensure_distributed()
    _HF_CONFIGS.append(_hf_zero3(config))  # transformers holds it weakly: keep it for the run
    with deepspeed.zero.Init(config_dict_or_path=config):
        yield


def _hf_zero3(config: dict) -> Any:
    try:
        from transformers.integrations import HfDeepSpeedConfig
    except ImportError:
        return None
    return HfDeepSpeedConfig(config)
