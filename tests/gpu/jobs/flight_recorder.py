"""The GPU suite's ``flight_recorder`` check: what each worker sees of PyTorch's NCCL flight recorder (the
variables raytrain sets, the dump folder, and on CUDA the entries the recorder holds after a few all-reduces),
printed as one ``@@flight_recorder {json}`` line per rank and, with ``--out FOLDER`` (a path the suite reads on
the same machine), written to ``FOLDER/rank-N.json``: a worker's last lines of a one-second job can reach the
job's log after the job has ended, on a cluster whose log monitor follows many files."""
import json
import os
import sys

import torch
import torch.distributed as dist

VARS = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")


def recorded_entries():
    """The collectives the flight recorder holds now (None where this torch has no dump function)."""
    import torch._C._distributed_c10d as c10d

    for name in ("_dump_nccl_trace_json", "_dump_fr_trace_json"):
        dump = getattr(c10d, name, None)
        if dump is not None:
            return len(json.loads(dump()).get("entries") or [])
    return None


def train(ctx):
    out = {"rank": ctx.rank, "env": {k: os.environ.get(k) for k in VARS},
           "backend": dist.get_backend() if dist.is_initialized() else None}
    if ctx.device.type == "cuda":
        t = torch.ones(1024, device=ctx.device)
        for _ in range(5):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        out["entries"] = recorded_entries()
    prefix = out["env"][VARS[2]]
    out["dump_folder_exists"] = bool(prefix) and os.path.isdir(os.path.dirname(prefix))
    if "--out" in ctx.args:
        folder = ctx.args[ctx.args.index("--out") + 1]
        with open(os.path.join(folder, f"rank-{ctx.rank}.json"), "w") as f:
            json.dump(out, f)
    sys.stdout.write("@@flight_recorder " + json.dumps(out) + "\n")
    sys.stdout.flush()
    ctx.report({"loss": 0.0, "step": 1})
