"""raytrain.runtime.checkpoint.async_save on real DeepSpeed engines (one process, gloo): a snapshot written later
holds the state of the step it was taken at, whatever training did since, and loads into an engine exactly as
a synchronous save (ZeRO 0-3, offload)."""
import json
import os
import subprocess
import sys
import textwrap

from tests.conftest import ROOT, free_port

SCRIPT = textwrap.dedent('''
    import json, sys, tempfile
    from pathlib import Path
    import torch
    import torch.distributed as dist
    from raytrain.runtime.checkpoint import files as checkpoint
    from raytrain.runtime.checkpoint.async_save import PinnedPool, snapshot
    from raytrain.runtime.worker.engine import build_engine

    dist.init_process_group("gloo", rank=0, world_size=1)

    def make(zero):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "train_batch_size": 2,
                  "zero_optimization": zero, "zero_force_ds_cpu_optimizer": False,
                  "zero_allow_untested_optimizer": True}
        return build_engine(model, optimizer=lambda p: torch.optim.AdamW(p, lr=0.01), config=config,
                            lr_scheduler=None, model_parameters=None)

    def train(engine, steps, first):
        for s in range(first, first + steps):
            g = torch.Generator().manual_seed(s)
            x, y = torch.randn(2, 8, generator=g), torch.randn(2, 2, generator=g)
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
        return float(loss)

    def params(engine):
        return [p.detach().clone() for p in engine.module.parameters()]

    out = {}
    for name, zero in (("z0", {"stage": 0}), ("z1", {"stage": 1}),
                       ("z2-offload", {"stage": 2, "offload_optimizer": {"device": "cpu"}}), ("z3", {"stage": 3})):
        engine = make(zero)
        train(engine, 3, 0)
        snap = snapshot(engine, PinnedPool(pin=False), rank=0, world_size=1, step=3, user_state={"k": [1]},
                        metrics={"step": 3})
        untouched = list(snap.directory.rglob("*.pt"))  # nothing written yet: the files are in memory
        sync_dir = checkpoint.save(engine, rank=0, world_size=1, step=3, user_state={"k": [1]}, metrics={"step": 3})
        train(engine, 2, 3)  # training goes on before the snapshot is written
        snap.write()
        # both load into a fresh engine and continue to the same loss
        losses = []
        for d in (str(snap.directory), sync_dir):
            fresh = make(zero)
            step, state = checkpoint.load(fresh, d, rank=0, world_size=1)
            losses.append((step, state, train(fresh, 2, 3)))
        same_files = sorted(p.relative_to(snap.directory).as_posix() for p in snap.directory.rglob("*") if p.is_file()) \\
            == sorted(p.relative_to(sync_dir).as_posix() for p in Path(sync_dir).rglob("*") if p.is_file())
        out[name] = {"unwritten": len(untouched), "losses": losses, "same_files": same_files,
                     "nbytes": snap.nbytes, "trained_on": train(engine, 0, 5) if False else None}
        engine.destroy()
    print("@@async " + json.dumps(out))
''')


def test_a_snapshot_is_the_state_of_its_step_and_loads_as_a_sync_save(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "DS_ACCELERATOR": "cpu", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("@@async ")), None)
    assert proc.returncode == 0 and line, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(line.removeprefix("@@async "))
    assert set(out) == {"z0", "z1", "z2-offload", "z3"}
    for name, facts in out.items():
        assert facts["unwritten"] == 0, name
        assert facts["same_files"], name
        (step_a, state_a, loss_a), (step_s, state_s, loss_s) = facts["losses"]
        assert (step_a, state_a) == (step_s, state_s) == (3, {"k": [1]}), name
        assert loss_a == loss_s, (name, loss_a, loss_s)  # bit for bit: the snapshot is the step-3 state
        assert facts["nbytes"] > 0, name
