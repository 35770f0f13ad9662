"""train_loop_per_worker for a train(ctx) job, without Ray: the driver's plan dict becomes one typed Plan,
the job file is found in the working_dir and gets a ctx built from it, and ctx.finish runs after train."""
import importlib
import json
import sys
import textwrap

import pytest

from raytrain.config import Options, Plan, resolve
from raytrain.events import METRICS, parse_line

FREEZE = __import__("gc").freeze  # the real one (fixtures below keep pytest's own heap unfrozen)

JOB = """
import json

def train(ctx):
    for step in range(ctx.start_step, 3):
        ctx.report({"loss": 1.0 / (step + 1)})
    with open("ctx.json", "w") as f:
        json.dump({"plan_type": type(ctx.plan).__name__, "rank": ctx.rank, "world_size": ctx.world_size,
                   "args": ctx.args, "micro_batch": ctx.micro_batch, "grad_accum": ctx.grad_accum,
                   "train_batch": ctx.train_batch, "dp_rank": ctx.dp_rank, "checkpoint_every": ctx.checkpoint_every,
                   "device": str(ctx.device), "resumed_from": ctx.resumed_from}, f)
"""


@pytest.fixture
def ray_train(monkeypatch):
    ray_train = importlib.import_module("ray.train")
    import ray.train.torch

    class Context:
        get_world_rank = staticmethod(lambda: 0)
        get_local_rank = staticmethod(lambda: 0)
        get_world_size = staticmethod(lambda: 1)
        get_local_world_size = staticmethod(lambda: 1)

    monkeypatch.setattr(ray_train, "get_context", lambda: Context())
    monkeypatch.setattr(ray_train, "get_checkpoint", lambda: None)
    monkeypatch.setattr(ray.train.torch, "get_device", lambda: "cpu")
    monkeypatch.setattr(ray_train, "report", lambda *a, **kw: pytest.fail("a metrics report went to Ray Train"))
    monkeypatch.setattr("raytrain.runtime.worker.reporter.MONITOR_INTERVAL_S", 0)  # no sampler thread
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # what the worker sets for CPU workers (setdefault)
    monkeypatch.setattr("gc.freeze", lambda: None)  # not pytest's own heap (the test below turns it on)
    monkeypatch.setenv("RAYTRAIN_BIND_CORES", "0")  # nor pytest's own threads
    return ray_train


def test_the_worker_runs_train_with_a_ctx_from_the_typed_plan(tmp_path, ray_train, monkeypatch, capsys):
    from raytrain.runtime.worker.loop import train_loop_per_worker

    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "train.py").write_text(textwrap.dedent(JOB))
    plan = resolve(Options(job=str(folder / "train.py"), workers=1, micro_batch=2, grad_accum=3,
                           checkpoint_every=5, job_args=["--x", "1"]))
    assert plan.mode == "train"
    monkeypatch.syspath_prepend(str(folder))  # Ray puts the unpacked working_dir on sys.path
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "raytrain_job", raising=False)
    train_loop_per_worker({"plan": json.loads(plan.to_json()), "resume_from": None})
    seen = json.loads((tmp_path / "ctx.json").read_text())
    assert seen == {"plan_type": Plan.__name__, "rank": 0, "world_size": 1, "args": ["--x", "1"], "micro_batch": 2,
                    "grad_accum": 3, "train_batch": 6, "dp_rank": 0, "checkpoint_every": 5, "device": "cpu",
                    "resumed_from": None}
    metrics = [e for e in map(parse_line, capsys.readouterr().out.splitlines()) if e and e["event"] == METRICS]
    assert [m["step"] for m in metrics] == [1, 2, 3]


FROZEN_JOB = """
import gc
import json

import torch

SEEN_BEFORE = torch.nn.Linear  # imported before train runs


def train(ctx):
    probe = [object()]
    probe.append(probe)  # a cycle made by the job: the collector still sees it
    json.dump({"frozen": gc.get_freeze_count(),  # gc.get_objects(): what the collector walks (not the frozen)
               "probe_collected_as_ever": any(o is probe for o in gc.get_objects())}, open("gc.json", "w"))
"""


def test_the_worker_freezes_the_heap_it_imported_before_the_job_runs(tmp_path, ray_train, monkeypatch):
    import gc

    from raytrain.runtime.worker.loop import train_loop_per_worker

    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "train.py").write_text(textwrap.dedent(FROZEN_JOB))
    plan = resolve(Options(job=str(folder / "train.py"), workers=1))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "raytrain_job", raising=False)
    monkeypatch.setattr("gc.freeze", FREEZE)  # the worker freezes its heap, as in a real job
    before = len(gc.get_objects())
    try:
        train_loop_per_worker({"plan": json.loads(plan.to_json()), "resume_from": None})
    finally:
        gc.unfreeze()  # pytest's heap back to the collector
    seen = json.loads((tmp_path / "gc.json").read_text())
    assert seen["frozen"] >= before > 10_000  # everything the process held when the job started
    assert seen["probe_collected_as_ever"]  # what the job makes stays in the collector's sight


def test_the_collector_is_off_while_importing_and_back_on_after(monkeypatch):
    import gc

    from raytrain.runtime.worker.early_imports import collector_paused

    try:
        with collector_paused():
            assert not gc.isenabled()
            made_inside = [object()]
        assert gc.isenabled() and gc.get_freeze_count() > 0
        assert not any(o is made_inside for o in gc.get_objects())  # frozen: never walked again
    finally:
        gc.unfreeze()
    with pytest.raises(ImportError):  # a failed import: the collector is back on all the same
        with collector_paused():
            import raytrain_no_such_module  # noqa: F401
    gc.unfreeze()
    assert gc.isenabled()


def test_a_failing_job_prints_its_traceback_once_from_its_own_frames(tmp_path, ray_train, monkeypatch, capsys,
                                                                      caplog):
    import logging

    from raytrain.runtime.worker.loop import train_loop_per_worker
    from raytrain.ray_tuning.ray_access import RAY_TRAIN_ERROR_LOGGER as RAY_TRAIN_UTIL_LOGGER

    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "train.py").write_text("def load(path):\n    raise ValueError(f'no data at {path}')\n\n"
                                     "def train(ctx):\n    load('/nope')\n")
    plan = resolve(Options(job=str(folder / "train.py"), workers=1))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "raytrain_job", raising=False)
    with pytest.raises(ValueError, match="no data at /nope"):
        train_loop_per_worker({"plan": json.loads(plan.to_json()), "resume_from": None})
    err = capsys.readouterr().err
    assert err.count("Traceback (most recent call last):") == 1, err
    frames = [line for line in err.splitlines() if line.startswith('  File "')]
    assert [f.rsplit(" ", 1)[1] for f in frames] == ["train", "load"], err  # the job's frames, not raytrain's
    assert err.rstrip().endswith("ValueError: no data at /nope"), err
    with caplog.at_level(logging.ERROR, logger=RAY_TRAIN_UTIL_LOGGER):  # Ray Train's own copy is left out
        logging.getLogger(RAY_TRAIN_UTIL_LOGGER).error("Error in training function:\nTraceback ...")
        logging.getLogger(RAY_TRAIN_UTIL_LOGGER).error("something else")
    assert [r.getMessage() for r in caplog.records] == ["something else"]


def test_ctx_keeps_the_surface_jobs_use():
    """What the README's ctx table and the jobs use, on the one object train(ctx) receives."""
    from raytrain.runtime.worker.context import TrainContext
    from tests.conftest import JOBS

    ctx = TrainContext(resolve(Options(job=str(JOBS / "cnn.py"), workers=1)), rank=0, local_rank=0, world_size=1,
                       device="cpu")
    for name in ("deepspeed", "pipeline", "checkpointed", "report", "log", "finish", "start_monitor"):
        assert callable(getattr(ctx, name)), name
    for name in ("rank", "local_rank", "world_size", "is_main", "device", "dtype", "args", "config", "micro_batch",
                 "grad_accum", "train_batch", "dp_rank", "dp_size", "dp", "tp", "pp", "state", "start_step",
                 "resumed_from", "engine", "name", "plan", "activation_checkpointing", "checkpoint_every", "monitor"):
        getattr(ctx, name)
    assert (ctx.start_step, ctx.state, ctx.resumed_from, ctx.engine, ctx.is_main) == (0, {}, None, None, True)
