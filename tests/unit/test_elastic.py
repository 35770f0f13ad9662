"""Elastic --workers MIN-MAX: parsing, the global batch kept across sizes, and the rules resolve applies."""
import pytest

from raytrain.capacity import Node, capacity_problem
from raytrain.config import Options, resolve
from raytrain.config.elastic import accum_for, parse_workers, rescale
from raytrain.config.plan import Plan
from raytrain.errors import ConfigError
from tests.conftest import JOBS

CNN = str(JOBS / "cnn.py")


def plan(**kw):
    kw.setdefault("job", CNN)
    return resolve(Options(**kw))


@pytest.mark.parametrize("value, expected", [(4, (4, 4)), ("4", (4, 4)), ("2-4", (2, 4)), (" 1 - 2 ", (1, 2))])
def test_parse_workers(value, expected):
    assert parse_workers(value) == expected


@pytest.mark.parametrize("value, words", [("4-2", "write it as 2-4"), ("0-2", ">= 1"), ("two", "MIN-MAX"), ("1-", "MIN-MAX")])
def test_parse_workers_errors_name_the_flag(value, words):
    with pytest.raises(ConfigError) as err:
        parse_workers(value)
    assert err.value.flag == "--workers" and words in str(err.value)


def test_global_batch_is_kept_by_raising_grad_accum():
    p = plan(workers="1-2", micro_batch=4, grad_accum=2, zero=3, precision="bf16")
    assert p.scaling.num_workers == 2 and p.scaling.min_workers == 1 and p.scaling.elastic
    assert p.scaling.workers_label == "1-2"
    assert p.train_batch == 16 and p.deepspeed["gradient_accumulation_steps"] == 2
    ds, accum = rescale(p.deepspeed, train_batch=p.train_batch, dp=1)
    assert accum == 4 and ds["gradient_accumulation_steps"] == 4 and ds["train_batch_size"] == 16
    assert p.deepspeed["gradient_accumulation_steps"] == 2  # the plan's dict is not changed
    assert Plan.from_dict(p.to_dict()).scaling.min_workers == 1


def test_a_size_that_cannot_keep_the_batch_is_refused_with_a_batch_that_works():
    with pytest.raises(ConfigError) as err:
        plan(workers="2-4", micro_batch=1, grad_accum=1)  # global 4: 3 workers cannot keep it
    msg = str(err.value)
    assert err.value.flag == "--workers" and "3 worker(s)" in msg and "--train-batch 12" in msg
    assert plan(workers="2-4", train_batch=12).train_batch == 12
    assert accum_for(12, 1, 3) == 4 and accum_for(12, 1, 5) is None


def test_elastic_defaults_to_restarts_and_refuses_none():
    assert plan(workers="1-2").max_failures == 3
    assert plan(workers="1-2", max_failures=5).max_failures == 5
    assert plan(workers=2).max_failures == 0
    with pytest.raises(ConfigError) as err:
        plan(workers="1-2", max_failures=0)
    assert err.value.flag == "--max-failures"


def test_elastic_is_data_parallel_only():
    with pytest.raises(ConfigError) as err:
        plan(job=str(JOBS / "gpt_tp.py"), workers="2-4", tp=2)
    assert err.value.flag == "--workers" and "--tp 2" in str(err.value)


def test_fixed_workers_are_not_elastic():
    p = plan(workers=3)
    assert p.scaling.min_workers is None and not p.scaling.elastic and p.scaling.workers_label == "3"


def test_capacity_of_an_elastic_request_is_its_minimum():
    nodes = [Node(node_id="a", address="10.0.0.1", resources={"CPU": 2.0}, alive=True)]
    assert capacity_problem(4, {"CPU": 1.0}, nodes, min_workers=2) is None
    problem = capacity_problem(4, {"CPU": 1.0}, nodes, min_workers=3)
    assert "--workers 3-4" in problem and "room for 2" in problem and "--workers 2-4" in problem
    assert capacity_problem(4, {"CPU": 1.0}, nodes) is not None


def test_interface_and_timeout_options():
    p = plan(interface="eth0", timeout=30)
    assert p.interface == "eth0" and p.timeout_s == 30
    assert plan().timeout_s == 600 and plan().interface is None
    with pytest.raises(ConfigError) as err:
        plan(interface="not a name")
    assert err.value.flag == "--interface"
    with pytest.raises(ConfigError) as err:
        plan(timeout=0)
    assert err.value.flag == "--timeout"


def test_elastic_needs_a_train_ctx_job():
    script = JOBS.parent / "tests" / "e2e" / "scripts" / "ds_regression.py"
    with pytest.raises(ConfigError) as err:
        plan(job=str(script), workers="1-2")
    assert err.value.flag == "--workers" and "script mode" in str(err.value)


def test_the_worker_context_keeps_the_global_batch_and_says_so(capsys):
    from raytrain.events import RESIZED, parse_line
    from raytrain.runtime.worker.context import TrainContext

    p = plan(workers="1-2", micro_batch=2, grad_accum=2)
    ctx = TrainContext(p, rank=0, local_rank=0, world_size=1, device="cpu")
    assert (ctx.grad_accum, ctx.dp, ctx.dp_size, ctx.train_batch) == (4, 1, 1, 8)
    assert ctx.config["gradient_accumulation_steps"] == 4 and ctx.config["train_batch_size"] == 8
    events = [parse_line(line) for line in capsys.readouterr().out.splitlines()]
    resized = [e for e in events if e and e["event"] == RESIZED]
    assert resized == [{"event": RESIZED, "workers": 1, "range": "1-2", "planned_workers": 2, "grad_accum": 4,
                        "planned_grad_accum": 2, "train_batch": 8}]
    full = TrainContext(p, rank=0, local_rank=0, world_size=2, device="cpu")  # the planned size: nothing to say
    assert full.grad_accum == 2 and "resized" not in capsys.readouterr().out
