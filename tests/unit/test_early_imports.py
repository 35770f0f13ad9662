"""Workers import torch and DeepSpeed in the background from their process start (runtime.worker.early_imports):
the runtime env the driver gives Ray Train's workers, the hook itself, and what the driver asks it to import."""
import sys
import time

import pytest

from raytrain.config.plan import Plan, Scaling
from raytrain.runtime.driver import entrypoint as driver
from raytrain.runtime.worker import early_imports


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(early_imports, "_thread", None)
    monkeypatch.setattr(early_imports, "_done_at", [])
    monkeypatch.setattr("gc.freeze", lambda: None)  # the imports here must not freeze pytest's own heap
    return monkeypatch


def test_the_workers_runtime_env_names_the_hook_and_the_modules(fresh):
    env = early_imports.worker_runtime_env(["torch", "deepspeed"], use_gpu=False)["env_vars"]
    assert env["__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"] == "raytrain.runtime.worker.early_imports.start"
    assert env["RAYTRAIN_WORKER_IMPORTS"] == "torch,deepspeed" and env["RAYTRAIN_WORKER_GPU"] == "0"
    fresh.setenv("RAYTRAIN_RAY_TUNING", "off")
    assert early_imports.worker_runtime_env(["torch"], use_gpu=False) == {}


def test_the_hook_imports_in_a_thread_and_wait_joins_it(fresh):
    fresh.delitem(sys.modules, "wave", raising=False)
    fresh.setenv("RAYTRAIN_WORKER_IMPORTS", "wave,no_such_module_xyz,colorsys")
    fresh.setenv("RAYTRAIN_WORKER_GPU", "0")
    fresh.delenv("DS_ACCELERATOR", raising=False)
    before = time.time()
    early_imports.start()
    assert early_imports._thread is not None and early_imports._thread.daemon
    assert early_imports.wait() is None  # a failed import: no time, the train function imports and reports
    assert "wave" in sys.modules
    import os

    assert os.environ["DS_ACCELERATOR"] == "cpu"
    fresh.setattr(early_imports, "_thread", None)
    fresh.setenv("RAYTRAIN_WORKER_IMPORTS", "colorsys")
    early_imports.start()
    assert early_imports.wait() >= before


def test_no_modules_no_thread(fresh):
    fresh.delenv("RAYTRAIN_WORKER_IMPORTS", raising=False)
    early_imports.start()
    assert early_imports._thread is None and early_imports.wait() is None


def test_transformers_is_imported_ahead_only_for_jobs_that_use_it(tmp_path, fresh):
    (tmp_path / "plain.py").write_text("import torch\n\ndef train(ctx):\n    pass\n")
    (tmp_path / "hf.py").write_text("import os\nfrom transformers import GPT2Config\n\ndef train(ctx):\n    pass\n")
    fresh.syspath_prepend(str(tmp_path))
    def plan(module):
        return Plan(
            name="x", job_file=str(tmp_path / module), job_dir=str(tmp_path), job_module=module, job_args=[],
            deepspeed={}, scaling=Scaling(num_workers=1, use_gpu=False, resources_per_worker={"CPU": 1}),
            parallel={"dp": 1, "tp": 1, "pp": 1}, train_batch=1, precision="fp32", zero=0, offload="none", storage=None,
        )

    assert driver.worker_imports(plan("plain.py")) == ["torch", "deepspeed"]
    assert driver.worker_imports(plan("hf.py")) == ["torch", "deepspeed", "transformers"]



def test_the_workers_get_omp_num_threads_before_the_hook_imports_torch(fresh):
    """libgomp reads OMP_NUM_THREADS when torch loads it, which the hook does before Ray sets the variable for
    the actor's task: the runtime env carries Ray's value (floor of the worker's CPUs, at least 1)."""
    assert early_imports.worker_runtime_env(["torch"], use_gpu=False)["env_vars"]["OMP_NUM_THREADS"] == "1"
    assert early_imports.worker_runtime_env(["torch"], False, 0.5)["env_vars"]["OMP_NUM_THREADS"] == "1"
    assert early_imports.worker_runtime_env(["torch"], True, 4.0)["env_vars"]["OMP_NUM_THREADS"] == "4"
    # the job's --env OMP_NUM_THREADS=3 is in the job's runtime env, which the workers' env is merged over
    assert "OMP_NUM_THREADS" not in early_imports.worker_runtime_env(["torch"], False, 1.0, {"OMP_NUM_THREADS": "***"})[
        "env_vars"]


PROBE = """
import os, sys
from raytrain.runtime.worker import early_imports
early_imports.start()
early_imports.wait()
import torch
print("AT_IMPORT", torch.get_num_threads())
os.environ["OMP_NUM_THREADS"] = "1"  # what Ray sets for a 1-CPU actor's task, after the hook ran
early_imports.match_torch_threads()
print("MATCHED", torch.get_num_threads())
"""


@pytest.mark.parametrize("omp", ["1", None])
def test_torch_imported_by_the_hook_runs_the_workers_threads(omp):
    """Real torch and libgomp, imported in the hook's thread as on a worker: with the runtime env's
    OMP_NUM_THREADS torch starts with that many threads; without it (Ray sets it only later) torch takes one
    per core, and the worker's match_torch_threads brings it back to the variable's count."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env.update(RAYTRAIN_WORKER_IMPORTS="torch", RAYTRAIN_WORKER_GPU="0")
    if omp:
        env["OMP_NUM_THREADS"] = omp
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split() for line in out.stdout.splitlines() if line.split()[0] in ("AT_IMPORT", "MATCHED"))
    assert int(lines["AT_IMPORT"]) == (1 if omp else len(os.sched_getaffinity(0)))  # libgomp: one per usable core
    assert lines["MATCHED"] == "1"
