"""Minimal reproduction for DeepSpeed (0.19.8): under pipeline parallelism the gradient-clipping norm counts
only stage 0's gradients, so 2 stages train differently from 1 stage whenever clipping acts.

    DS_ACCELERATOR=cpu torchrun --standalone --nproc_per_node 1 deepspeed_pp_clip.py   # 1 stage
    DS_ACCELERATOR=cpu torchrun --standalone --nproc_per_node 2 deepspeed_pp_clip.py   # 2 stages: drifts from step 2
    ... deepspeed_pp_clip.py --tag   # tag parameters model_parallel=True: 2 stages equal 1 stage
    ... deepspeed_pp_clip.py --no-clip   # gradient_clipping 0: 2 stages equal 1 stage

Cause: deepspeed/runtime/utils.py clip_grad_norm_ / get_grad_norm count a parameter when
``mpu.get_model_parallel_rank() == 0`` or it is tagged model-parallel; in PipelineParallelGrid stage k reports
model-parallel rank k and its parameters are untagged, so stage 1's gradients are left out of the global norm
and both stages are scaled by stage 0's norm. (Report drafted for github.com/deepspeedai/DeepSpeed; no network
from the machine it was found on.)
"""
import sys

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from deepspeed.pipe import PipelineModule


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(32, 64), nn.Linear(64, 32)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


def main():
    deepspeed.init_distributed(dist_backend="gloo")
    stages = dist.get_world_size()
    torch.manual_seed(0)
    layers = [Block() for _ in range(4)] + [nn.Linear(32, 4)]
    module = PipelineModule(layers=layers, num_stages=stages, loss_fn=lambda o, y: F.mse_loss(o, y),
                            partition_method="parameters")
    if "--tag" in sys.argv:
        for p in module.parameters():
            p.model_parallel = True
    config = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
              "gradient_clipping": 0.0 if "--no-clip" in sys.argv else 1.0, "steps_per_print": 10**9}
    engine, *_ = deepspeed.initialize(model=module, config=config,
                                      optimizer=torch.optim.SGD(module.parameters(), lr=0.05))
    for step in range(6):
        batches = []
        for m in range(2):
            g = torch.Generator().manual_seed(step * 100 + m)
            batches.append((torch.randn(4, 32, generator=g), 3.0 * torch.randn(4, 4, generator=g)))
        loss = engine.train_batch(data_iter=iter(batches))
        if dist.get_rank() == 0:
            print(f"stages {stages} step {step + 1} loss {float(loss):.6f}", flush=True)


if __name__ == "__main__":
    main()
