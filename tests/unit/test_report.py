"""ctx.report on the training path: metrics go to the job's event log and never wait for Ray Train (issue 18).

``ray.train.report`` blocks until Ray Train's controller polls the workers (half the health-check interval on
average, every step); only a report that carries a checkpoint may take that path.
"""
import pytest
import torch

from raytrain.config import Options, resolve
from raytrain.events import METRICS, parse_line
from raytrain.runtime.worker.context import TrainContext
from tests.conftest import JOBS


@pytest.fixture
def no_ray_train_report(monkeypatch):
    """Record every ray.train.report call (the real one, outside a Ray Train run, would raise)."""
    import ray.train

    calls = []
    monkeypatch.setattr(ray.train, "report", lambda *a, **kw: calls.append((a, kw)))
    return calls


def make_ctx(checkpoint_every=0):
    plan = resolve(Options(job=str(JOBS / "cnn.py"), workers=1, checkpoint_every=checkpoint_every))
    return TrainContext(plan, rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def test_metrics_reports_go_to_the_event_log_not_to_ray_train(no_ray_train_report, capsys):
    ctx = make_ctx()
    for step in range(1, 201):
        ctx.report({"step": step, "loss": torch.tensor(1.0 / step)})
    assert no_ray_train_report == []
    metrics = [e for e in map(parse_line, capsys.readouterr().out.splitlines()) if e and e["event"] == METRICS]
    assert [m["step"] for m in metrics] == list(range(1, 201))
    assert metrics[-1]["loss"] == pytest.approx(1 / 200)  # tensors become floats
    assert {"samples_per_s", "step_time_s", "elapsed_s", "wall_time"} <= set(metrics[-1])


def test_checkpoint_steps_without_an_engine_do_not_call_ray_train(no_ray_train_report, capsys):
    ctx = make_ctx(checkpoint_every=2)
    ctx.report({"step": 2, "loss": 1.0})  # a checkpoint step, but no engine yet: nothing to save
    ctx.report({"step": 3, "loss": 1.0}, checkpoint=True)
    assert no_ray_train_report == []



class _FP16Optimizer:
    loss_scale = 32768.0  # DeepSpeed's ZeRO/FP16 optimizers: the dynamic scaler's current scale


class _FP16Engine:
    """The attributes a DeepSpeed fp16 engine has (fp16 cannot run on CPU: bench/gpu_mfu.py runs the real one
    on a GPU, through the same ``loss_scaling``)."""
    skipped_steps = 3
    optimizer = _FP16Optimizer()
    global_steps = 7

    def fp16_enabled(self):
        return True


def test_an_fp16_engine_reports_its_loss_scale_and_skipped_steps(no_ray_train_report, capsys):
    from raytrain.runtime.worker.reporter import loss_scaling

    assert loss_scaling(_FP16Engine()) == {"skipped_steps": 3, "loss_scale": 32768.0}
    assert loss_scaling(None) == {} and loss_scaling(object()) == {}
    bf16 = _FP16Engine()
    bf16.fp16_enabled = lambda: False
    assert loss_scaling(bf16) == {}
    ctx = make_ctx()
    ctx.engine = _FP16Engine()
    ctx.report({"loss": 1.5})
    (event,) = [e for e in map(parse_line, capsys.readouterr().out.splitlines()) if e and e["event"] == METRICS]
    assert event["loss_scale"] == 32768.0 and event["skipped_steps"] == 3 and event["step"] == 7
    assert no_ray_train_report == []


def test_the_progress_line_shows_fp16_loss_scaling():
    from raytrain.cli.progress import describe_metrics

    line = describe_metrics({"step": 9, "loss": 2.5, "loss_scale": 16384.0, "skipped_steps": 3})
    assert "loss scale 16384 (3 step(s) skipped on overflow)" in line and "loss_scale" not in line, line
    line = describe_metrics({"step": 2, "loss": 2.5, "loss_scale": 65536.0, "skipped_steps": 0})
    assert line.endswith("loss scale 65536"), line
    assert "loss scale" not in describe_metrics({"step": 2, "loss": 2.5})  # bf16/fp32: nothing to scale


def test_a_loss_scale_that_raises_is_not_swallowed():
    """An fp16 engine whose optimizer raises on ``loss_scale`` (a DeepSpeed that renamed what it reads) fails
    loudly instead of reporting no loss scale at all."""
    from raytrain.runtime.worker.reporter import loss_scaling

    class Broken:
        @property
        def loss_scale(self):
            return self.loss_scaler.cur_scale  # no loss_scaler: AttributeError

    engine = _FP16Engine()
    engine.optimizer = Broken()
    with pytest.raises(AttributeError):
        loss_scaling(engine)
