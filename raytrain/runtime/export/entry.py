"""``python -m raytrain.runtime.export.entry CHECKPOINT_DIR OUT.pt``: a consolidated fp32 state_dict
(``--format hf``: a Hugging Face model folder, raytrain.runtime.export.hf).

Runs in its own process (the CLI never imports deepspeed). Uses DeepSpeed's zero_to_fp32 path for ZeRO
checkpoints (stages 1-3: fp32 master weights gathered from every rank's shard) and the module weights
for stage 0. The result loads with ``model.load_state_dict(torch.load(OUT))``, without DeepSpeed.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from raytrain.checkpoints import marker as markers
from raytrain.runtime.export.consolidate import consolidated_state


def save_atomically(state: dict, out: str) -> None:
    """``torch.save`` into a temporary file next to ``out``, then rename it into place: ``out`` is the old file
    or the whole new one, never a partial one."""
    import os
    import tempfile

    import torch

    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as a plain open() would have made it (mkstemp makes it private)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def export(checkpoint_dir: str, out: str) -> dict:
    d = Path(checkpoint_dir)
    marker = markers.read(d)
    state = consolidated_state(d, marker.tag)
    save_atomically(state, out)
    return {
        "checkpoint": str(d),
        "step": marker.step,
        "out": out,
        "tensors": len(state),
        "parameters": int(sum(v.numel() for v in state.values())),
    }


def main(argv: list[str]) -> dict:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m raytrain.runtime.export.entry")
    parser.add_argument("checkpoint")
    parser.add_argument("out")
    parser.add_argument("--format", choices=("pt", "hf"), default="pt")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--merge-adapter", action="store_true")
    parser.add_argument("--max-shard-size", default="2GB")
    a = parser.parse_args(argv)
    if a.format == "pt":
        return export(a.checkpoint, a.out)
    from raytrain.runtime.export.hf import export_hf

    return export_hf(a.checkpoint, a.out, dtype=a.dtype, merge_adapter=a.merge_adapter,
                     max_shard_size=a.max_shard_size)


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
