"""A torchrun-style script without a __main__ block that fails on rank 1 only (rank 0 ends normally)."""
import os

import torch.distributed as dist

dist.init_process_group(backend="gloo")
if dist.get_rank() == 1:
    raise ValueError(f"rank {os.environ['RANK']} cannot read its shard /data/shard-1")
print("fails_on_rank1: rank 0 done", flush=True)
