"""An Accelerate script in script mode, worker side without Ray: two forked processes with the gloo group
initialised the way Ray Train leaves it, then run_script with what the workers pass. Accelerator() must see
a MULTI_CPU run of 2 processes (the script asserts it), as under `accelerate launch --cpu`."""
import importlib
import os
import socket
import sys

import pytest

from raytrain.runtime.worker.script import Launch, accelerate_env, run_script
from tests.conftest import ROOT

SCRIPT = ROOT / "tests" / "e2e" / "scripts" / "accelerate_regression.py"


def test_accelerate_env_is_what_accelerate_launch_sets():
    assert accelerate_env(use_gpu=False, precision="bf16", config_path="/c.json", hf_trainer=False) == {
        "ACCELERATE_MIXED_PRECISION": "bf16", "ACCELERATE_USE_CPU": "true"}
    assert accelerate_env(use_gpu=True, precision="fp32", config_path="/c.json", hf_trainer=False) == {
        "ACCELERATE_MIXED_PRECISION": "no", "ACCELERATE_USE_DEEPSPEED": "true",
        "ACCELERATE_DEEPSPEED_CONFIG_FILE": "/c.json"}
    # a Trainer script sets Accelerate up from its TrainingArguments
    assert accelerate_env(use_gpu=False, precision="fp32", config_path="/c.json", hf_trainer=True) == {}


def _worker(rank, world, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    for key in [k for k in os.environ if k.startswith("ACCELERATE_")]:
        del os.environ[key]
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world)  # what Ray Train does before train_loop
    log = os.path.join(out_dir, f"rank{rank}.log")
    with open(log, "w", buffering=1) as f:
        sys.stdout = f
        run_script(SCRIPT, ["--steps", "4"], launch=Launch(rank, rank, world, world, 0, "127.0.0.1", port),
                   deepspeed_config={"train_batch_size": 16}, chdir=False,
                   accelerate={"use_gpu": False, "precision": "fp32", "hf_trainer": False})


def test_accelerator_sees_two_processes(tmp_path):
    importlib.import_module("accelerate")
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True, start_method="fork")
    out = (tmp_path / "rank0.log").read_text()
    assert "accelerate_regression done: processes 2, type MULTI_CPU, batches per process 16" in out, out
    assert out.count("accelerate_regression step") == 4
