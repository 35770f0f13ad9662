"""The pieces TrainContext delegates to, on their own (no Ray, no deepspeed): the reporter's step accounting,
when the checkpointer saves, and how an elastic run fits its world size."""
import importlib
import pytest

from raytrain.checkpoints import marker as markers
from raytrain.checkpoints.marker import Marker
from raytrain.config import Options, resolve
from raytrain.events import METRICS, RESIZED, parse_line
from raytrain.runtime.worker import reporter as reporter_module
from raytrain.runtime.checkpoint.lifecycle import Checkpointer
from raytrain.runtime.worker.reporter import Reporter, as_float
from raytrain.runtime.worker.resize import fit_to_world_size
from tests.conftest import JOBS


@pytest.fixture
def clock(monkeypatch):
    """time.perf_counter as seen by the reporter: 100.0, then whatever the test sets."""
    now = {"t": 100.0}
    monkeypatch.setattr(reporter_module.time, "perf_counter", lambda: now["t"])
    return now


def emitted(capsys, kind):
    return [e for e in map(parse_line, capsys.readouterr().out.splitlines()) if e and e["event"] == kind]


def test_throughput_and_step_time_come_from_the_global_batch(clock, capsys):
    rep = Reporter(rank=0, train_batch=32)
    clock["t"] = 102.0
    first = rep.report({"loss": 1.0, "step": 4})  # 4 steps in 2 s
    assert first["samples_per_s"] == 64.0 and first["step_time_s"] == 0.5 and first["elapsed_s"] == 2.0
    clock["t"] = 103.0
    second = rep.report({"loss": 0.5, "step": 5})  # 1 step in 1 s
    assert (second["samples_per_s"], second["step_time_s"], second["elapsed_s"]) == (32.0, 1.0, 3.0)
    assert [m["step"] for m in emitted(capsys, METRICS)] == [4, 5]
    assert rep.last_metrics is second


def test_step_defaults_to_the_engine_step_then_the_report_count(clock):
    rep = Reporter(rank=0, train_batch=8)
    assert rep.step_metrics({"loss": 1.0})["step"] == 1
    assert rep.step_metrics({"loss": 1.0}, engine_step=7)["step"] == 7
    clock["t"] = 101.0
    same = rep.step_metrics({"loss": 1.0, "step": 7})  # no step done since the last report: no throughput
    assert "samples_per_s" not in same and "step_time_s" not in same


def test_a_job_given_value_wins_and_values_become_floats(clock):
    rep = Reporter(rank=0, train_batch=8)
    clock["t"] = 101.0
    out = rep.step_metrics({"step": 1, "samples_per_s": 5, "loss": importlib.import_module("torch").tensor(0.25)})
    assert out["samples_per_s"] == 5 and out["loss"] == 0.25 and isinstance(out["loss"], float)
    assert as_float("text") == "text"


def test_after_a_restore_throughput_counts_from_the_restored_step(clock):
    rep = Reporter(rank=0, train_batch=10)
    rep.resume_at(100)
    clock["t"] = 102.0
    assert rep.step_metrics({"step": 101})["samples_per_s"] == 5.0


def test_only_rank_0_emits_metrics(capsys):
    Reporter(rank=1, train_batch=8).report({"loss": 1.0})
    assert emitted(capsys, METRICS) == []


def test_checkpoint_schedule_and_the_final_save():
    ckpt = Checkpointer(restore_from=None, every=3, rank=0, local_rank=0, world_size=1)
    assert [s for s in range(1, 10) if ckpt.due(s)] == [3, 6, 9]
    assert ckpt.final_save_needed({"step": 7}) and not ckpt.final_save_needed({})
    ckpt.last_saved_step = 7
    assert not ckpt.final_save_needed({"step": 7})
    never = Checkpointer(restore_from=None, every=0, rank=0, local_rank=0, world_size=1)
    assert not any(never.due(s) for s in range(1, 10)) and not never.final_save_needed({"step": 3})
    assert never.restore(engine=None) is None and never.saved_world_size is None


def test_the_restore_points_marker_is_read_once(tmp_path):
    markers.write(tmp_path, Marker(rank=0, world_size=4, step=12, tag="step12", time=1.0))
    ckpt = Checkpointer(restore_from=str(tmp_path), every=0, rank=0, local_rank=0, world_size=2)
    assert ckpt.saved_world_size == 4 and ckpt.saved.tag == "step12"
    unreadable = Checkpointer(restore_from=str(tmp_path / "missing"), every=0, rank=0, local_rank=0, world_size=2)
    assert unreadable.saved is None  # checkpoint.load then fails with the reason


def test_a_non_zero_restore_point_is_not_resharded(tmp_path):
    markers.write(tmp_path, Marker(rank=0, world_size=4, step=12, tag="step12", time=1.0))
    ckpt = Checkpointer(restore_from=str(tmp_path), every=0, rank=0, local_rank=0, world_size=2)
    config = {"zero_optimization": {"stage": 0}}
    ckpt.prepare_restore(config, tp=1, pp=1, log=print)
    assert config == {"zero_optimization": {"stage": 0}}


@pytest.mark.parametrize("world, saved, says", [(2, None, False), (1, None, True), (2, 1, True), (2, 2, False)])
def test_an_elastic_run_fits_its_world_size(capsys, world, saved, says):
    plan = resolve(Options(job=str(JOBS / "cnn.py"), workers="1-2", micro_batch=2, grad_accum=2))
    config, accum, parallel = fit_to_world_size(
        plan, dict(plan.deepspeed), world_size=world, rank=0, saved_world_size=saved
    )
    assert accum == 4 // world and config["train_batch_size"] == 8 and parallel == {"dp": world, "tp": 1, "pp": 1}
    assert bool(emitted(capsys, RESIZED)) == says
    assert plan.deepspeed["gradient_accumulation_steps"] == 2  # the plan itself is left as planned


def test_a_fixed_size_run_keeps_the_plan():
    plan = resolve(Options(job=str(JOBS / "cnn.py"), workers=2, micro_batch=2, grad_accum=3))
    config, accum, parallel = fit_to_world_size(plan, plan.deepspeed, world_size=2, rank=0, saved_world_size=None)
    assert config is plan.deepspeed and accum == 3 and parallel == plan.parallel



def _complete(run_dir, name, step, world=2):
    """A checkpoint folder as the ranks leave it: each rank's file, then its marker listing it."""
    d = run_dir / name
    d.mkdir(parents=True)
    for rank in range(world):
        (d / f"shard{rank}.pt").write_bytes(b"x" * (10 + rank))
        markers.write(d, Marker(rank=rank, world_size=world, step=step, tag=f"step{step}", time=float(step),
                                files={f"shard{rank}.pt": 10 + rank}))
    return d


def test_a_restart_continues_from_a_complete_checkpoint_ray_train_never_registered(tmp_path):
    from types import SimpleNamespace

    from raytrain.runtime.worker.loop import unregistered_newer

    plan = SimpleNamespace(storage=str(tmp_path))
    run = tmp_path / "raytrain-job-1"
    assert unregistered_newer(plan, "raytrain-job-1", None) is None  # a first attempt: nothing to continue from
    older = _complete(run, "checkpoint_a", 4)
    newest = _complete(run, "checkpoint_b", 8)
    torn = _complete(run, "checkpoint_c", 12)
    (torn / "raytrain_rank1.json").unlink()  # rank 1 never finished its save: not a restore point
    assert unregistered_newer(plan, "raytrain-job-1", None).path == str(newest)  # Ray Train registered none
    assert unregistered_newer(plan, "raytrain-job-1", str(older)).path == str(newest)  # only an older one
    assert unregistered_newer(plan, "raytrain-job-1", str(newest)) is None  # Ray Train's is the newest: use it
    assert unregistered_newer(SimpleNamespace(storage="s3://bucket/runs"), "raytrain-job-1", None) is None
    assert unregistered_newer(SimpleNamespace(storage=None), "raytrain-job-1", None) is None


def test_with_keep_each_attempt_starts_by_removing_the_runs_uncommitted_checkpoints(tmp_path, capsys):
    from types import SimpleNamespace

    from raytrain.runtime.worker.loop import remove_uncommitted

    run = tmp_path / "raytrain-job-1"
    committed = _complete(run, "checkpoint_a", 4)
    torn = _complete(run, "checkpoint_b", 8)
    (torn / "raytrain_rank1.json").unlink()  # rank 1 died uploading step 8
    other_run = _complete(tmp_path / "raytrain-job-0", "checkpoint_a", 2)
    (other_run / "raytrain_rank1.json").unlink()
    for plan in (SimpleNamespace(storage=str(tmp_path), keep=None),  # no --keep: every folder stays (--all lists it)
                 SimpleNamespace(storage="s3://bucket/runs", keep=2), SimpleNamespace(storage=None, keep=2)):
        remove_uncommitted(plan, "raytrain-job-1")
        assert torn.is_dir() and capsys.readouterr().out == ""
    remove_uncommitted(SimpleNamespace(storage=str(tmp_path), keep=2), "raytrain-job-1")
    assert not torn.exists() and committed.is_dir() and other_run.is_dir()  # only this run's folder
    said = capsys.readouterr().out.splitlines()
    assert len(said) == 1 and said[0].startswith(f"raytrain: --keep 2: removed the uncommitted checkpoint {torn} "
                                                 "(step 8, rank 1 marker missing, "), said
