"""An Accelerate training script, written for `accelerate launch --cpu --num_processes 2 accelerate_regression.py`:
Accelerator(), accelerator.prepare(model, optimizer, dataloader), accelerator.backward(loss). raytrain's tests
run it unchanged in script mode; it asserts it sees every worker as one of its processes."""
import argparse

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--expect-processes", type=int, default=2)
    args = parser.parse_args()
    accelerator = Accelerator()
    assert accelerator.num_processes == args.expect_processes, accelerator.state
    assert accelerator.distributed_type == DistributedType.MULTI_CPU, accelerator.distributed_type
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(42)
    x = torch.randn(256, 8, generator=g)
    y = x @ (torch.randn(8, 1, generator=g) / 8 ** 0.5)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8, shuffle=False)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    batches = iter(loader)
    for step in range(1, args.steps + 1):
        xb, yb = next(batches)
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        accelerator.print(f"accelerate_regression step {step} loss {loss.item():.6f}")
    weights = accelerator.gather(model.module.weight.detach() if hasattr(model, "module") else model.weight.detach())
    assert torch.allclose(weights[0], weights[-1]), "the processes' parameters diverged"
    accelerator.print(
        f"accelerate_regression done: processes {accelerator.num_processes}, type {accelerator.distributed_type.value}, "
        f"batches per process {len(loader)}"
    )


if __name__ == "__main__":
    main()
