"""Workers import torch and DeepSpeed in the background from their process start (runtime.early_imports):
the runtime env the driver gives Ray Train's workers, the hook itself, and what the driver asks it to import."""
import sys
import time

import pytest

from raytrain.config.plan import Plan, Scaling
from raytrain.runtime import driver, early_imports


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(early_imports, "_thread", None)
    monkeypatch.setattr(early_imports, "_done_at", [])
    return monkeypatch


def test_the_workers_runtime_env_names_the_hook_and_the_modules(fresh):
    env = early_imports.worker_runtime_env(["torch", "deepspeed"], use_gpu=False)["env_vars"]
    assert env["__RAY_WORKER_PROCESS_SETUP_HOOK_ENV_VAR"] == "raytrain.runtime.early_imports.start"
    assert env["RAYTRAIN_WORKER_IMPORTS"] == "torch,deepspeed" and env["RAYTRAIN_WORKER_GPU"] == "0"
    fresh.setenv("RAYTRAIN_EARLY_IMPORTS", "0")
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

