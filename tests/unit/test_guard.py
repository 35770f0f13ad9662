"""The non-finite guard (raytrain.runtime.worker.guard): the verdict's wording, the no-update block, and two real
gloo processes with real DeepSpeed engines where only rank 1's loss is non-finite: both ranks skip the step,
at ZeRO-0 (whose client optimizer would otherwise apply it), ZeRO-1 and ZeRO-3 (no per-step all-reduce there),
leaving weights, optimizer state and LR schedule as they were and counting the step; honest endings and the
skip event's reading."""
import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest
import torch

from raytrain import events
from raytrain.runtime.worker import guard


def test_the_verdict_names_the_step_and_the_ranks():
    assert guard.describe(6, [0, guard.LOSS]) == "step 6 skipped: non-finite loss on rank 1"
    # gradients reduced across ranks are non-finite everywhere: the loss names where it started
    assert guard.describe(6, [guard.GRADIENTS, guard.LOSS | guard.GRADIENTS, guard.GRADIENTS]) == (
        "step 6 skipped: non-finite loss on rank 1")
    assert guard.describe(6, [guard.GRADIENTS, guard.GRADIENTS]) == (
        "step 6 skipped: non-finite gradients on ranks 0, 1")


def test_no_update_block_leaves_weights_and_state_and_restores_step():
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([w], lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)  # patches an instance attribute `step` on opt
    patched = vars(opt).get("step")
    w.grad = torch.ones(3)
    with guard._NoUpdate(guard.innermost_optimizers(opt)):
        opt.step()
    assert torch.equal(w.detach(), torch.ones(3)) and not opt.state
    assert vars(opt).get("step") is patched
    opt.step()
    sched.step()
    assert not torch.equal(w.detach(), torch.ones(3)) and opt.state


def test_innermost_optimizer_under_wrappers():
    class Wrapper:  # DeepSpeed's ZeRO and bf16 wrappers keep the torch optimizer in `.optimizer`
        def __init__(self, inner):
            self.optimizer = inner

    inner = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1.0)
    assert guard.innermost_optimizers(Wrapper(Wrapper(inner))) == [inner]
    assert guard.innermost_optimizers(inner) == [inner]


def test_an_ending_with_a_nan_loss_is_a_problem_on_rank_0():
    assert guard.ending_problem(None, {"step": 8, "loss": float("nan")}, rank=0, world_size=1) == (
        "the run ended with a non-finite loss (nan) at step 8")
    assert guard.ending_problem(None, {"step": 8, "loss": 0.5}, rank=0, world_size=1) is None
    assert guard.ending_problem(None, {}, rank=0, world_size=1) is None


def test_skip_events_reach_the_facts_and_status():
    from raytrain.status import JobInfo, JobState

    line = events.format_event(events.SKIPPED, step=6, message="step 6 skipped: non-finite loss on rank 1",
                               ranks={"1": "loss"})
    facts = events.JobFacts.from_lines(["(RayTrainWorker pid=1) " + line])
    assert facts.skipped == [{"event": "skipped", "step": 6, "message": "step 6 skipped: non-finite loss on rank 1",
                              "ranks": {"1": "loss"}}]
    info = JobInfo(job_id="j", name="n", state=JobState.RUNNING, target="local", address="", facts=facts)
    assert info.to_dict()["skipped"][0]["step"] == 6


RANKS = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist
    rank = int(sys.argv[1])
    dist.init_process_group("gloo", rank=rank, world_size=2, init_method="tcp://127.0.0.1:" + sys.argv[2])
    from raytrain.runtime.worker import guard
    from raytrain.runtime.worker.engine import build_engine
    out = {}
    for zero in (0, 1, 3):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
                  "train_batch_size": 4, "zero_optimization": {"stage": zero}, "gradient_clipping": 1.0,
                  "zero_allow_untested_optimizer": True}
        engine = build_engine(model, optimizer=opt, config=config, lr_scheduler=sched, model_parameters=None)
        emitted = []
        engine._raytrain_guard.emit = lambda kind, **data: emitted.append(dict(kind=kind, **data))
        def step(bad):
            for micro in range(2):
                x = torch.ones(1, 4)
                if bad is True and rank == 1 and micro == 1:
                    x[0, 0] = float("inf")
                y = engine(x)
                loss = y.pow(2).mean()
                if bad == "grad" and rank == 1 and micro == 1:  # a finite loss (0 added) with NaN gradients
                    loss = loss + torch.sqrt((y * 0).sum())
                if bad == "loss" and rank == 1 and micro == 1:  # a non-finite loss with finite gradients
                    loss = loss + torch.tensor(float("inf"))
                engine.backward(loss)
                if micro == 1:  # the step's all-reduce already started (launch_early) or not
                    early.append(engine._raytrain_guard._pending is not None)
                engine.step()
        early = []
        def weights():  # this rank's share under ZeRO-3
            return [t.detach().clone() for t in guard._local_tensors(engine)]
        step(False)
        before, lr_before = weights(), engine.get_lr()[0]
        step(True)
        after = weights()
        res = {"same": all(torch.equal(a, b) for a, b in zip(before, after)),
               "finite": all(bool(torch.isfinite(a).all()) for a in after),
               "global_steps": engine.global_steps, "skipped_steps": engine.skipped_steps,
               "lr_kept": engine.get_lr()[0] == lr_before, "emitted": list(emitted)}
        step(False)
        res["moves_after"] = not all(torch.equal(a, b) for a, b in zip(after, weights()))
        res["finite_after"] = all(bool(torch.isfinite(a).all()) for a in weights())
        emitted.clear()
        before = weights()
        step("grad")
        res["grad_only_same"] = all(torch.equal(a, b) for a, b in zip(before, weights()))
        res["grad_only_emitted"] = list(emitted)
        emitted.clear()
        before, lr_before = weights(), engine.get_lr()[0]
        step("loss")
        res["loss_only_same"] = all(torch.equal(a, b) for a, b in zip(before, weights()))
        res["loss_only_lr_kept"] = engine.get_lr()[0] == lr_before
        res["loss_only_emitted"] = emitted
        res["end_steps"] = [engine.global_steps, engine.skipped_steps]
        res["early"] = sorted(set(early))
        res["by_overflow"] = engine._raytrain_guard._by_overflow
        out[zero] = res
    print("@@result " + json.dumps(out), flush=True)
    dist.destroy_process_group()  # gloo's threads left running at exit can abort the process
""")


@pytest.mark.timeout(300)
def test_two_ranks_agree_and_skip_a_step_only_rank_1_saw_as_non_finite(tmp_path):
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), port], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env={**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2"})
             for r in (0, 1)]
    outs = [p.communicate(timeout=280)[0] for p in procs]
    results = []
    for rank, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, out
        results.append(json.loads(next(l for l in out.splitlines() if l.startswith("@@result "))[9:]))
    for rank, res in enumerate(results):
        for zero in ("0", "1", "3"):
            r = res[zero]
            assert r["same"] and r["finite"], (rank, zero, r)
            assert r["global_steps"] == 2 and r["skipped_steps"] == 1 and r["lr_kept"], (rank, zero, r)
            # under ZeRO DeepSpeed's agreed skip decides, no all-reduce per step; without, the verdict needs one
            assert r["early"] == [False] and r["by_overflow"] == (zero != "0"), (rank, zero, r)
            assert r["moves_after"] and r["finite_after"], (rank, zero, r)
            if rank == 0:
                (event,) = r["emitted"]
                assert event["kind"] == "skipped" and event["step"] == 2, (zero, event)
                assert event["message"] == "step 2 skipped: non-finite loss on rank 1", (zero, event)
                assert event["ranks"]["1"] == "loss", (zero, event)
            else:
                assert r["emitted"] == [], (rank, zero, r)
            # a gradient-only problem: without ZeRO the guard's own check (after the reduction, on every rank);
            # under ZeRO the optimizer's non-finite norm, which the guard reports
            assert r["grad_only_same"], (rank, zero, r)
            said = {"0": "step 4 skipped: non-finite gradients on ranks 0, 1",
                    "1": "step 4 skipped: non-finite gradients (DeepSpeed's optimizer found a non-finite gradient norm)"}
            said["3"] = said["1"]
            assert [e["message"] for e in r["grad_only_emitted"]] == ([said[zero]] if rank == 0 else []), (rank, r)
            # a non-finite loss whose gradients are finite is skipped all the same, and named
            assert r["loss_only_same"] and r["loss_only_lr_kept"], (rank, zero, r)
            assert [e["message"] for e in r["loss_only_emitted"]] == (
                ["step 5 skipped: non-finite loss on rank 1"] if rank == 0 else []), (rank, zero, r)
            assert r["end_steps"] == [5, 3], (rank, zero, r)


def test_weights_check_reads_zero3_partitions():
    model = torch.nn.Linear(2, 2)
    assert guard.local_weights_finite(model)
    model.bias.ds_tensor = torch.tensor([float("nan")])  # ZeRO-3: the rank's partition, not the (empty) param
    assert not guard.local_weights_finite(model)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_weights_check_by_sum_tells_overflow_from_non_finite(dtype):
    """The check sums each tensor first: a sum that overflows from finite weights is not taken for a NaN/inf."""
    big = torch.finfo(dtype).max / 2
    model = torch.nn.Linear(64, 64).to(dtype)
    with torch.no_grad():
        model.weight.fill_(big)  # every weight finite, their sum is not (in fp32)
        assert guard.local_weights_finite(model)
        for bad in (float("nan"), float("inf"), -float("inf")):
            model.weight.fill_(0.5)
            model.weight[3, 7] = bad
            assert not guard.local_weights_finite(model), bad


def test_no_checkpoint_of_non_finite_weights(capsys):
    from raytrain.runtime.worker.context import TrainContext

    saved = []

    class Checkpoints:
        def save(self, engine, metrics, state):
            saved.append(metrics["step"])

    ctx = TrainContext.__new__(TrainContext)
    ctx.rank, ctx.world_size, ctx.state, ctx._positions = 0, 1, {}, {}
    ctx._checkpoints, ctx.engine = Checkpoints(), torch.nn.Linear(2, 2)
    ctx._save({"step": 3})
    with torch.no_grad():
        ctx.engine.weight[0, 0] = float("inf")
    ctx._save({"step": 4})
    assert saved == [3]
    facts = events.JobFacts.from_lines(capsys.readouterr().out.splitlines())
    assert [(e["step"], e["message"]) for e in facts.refused] == [
        (4, "checkpoint of step 4 not written: the weights are non-finite")]


def test_the_local_code_checks_every_micro_batch_loss_once_at_the_step_and_clears_them():
    # the losses noted over a step's micro-batches are checked together at the step: one bad one is enough,
    # a float loss counts, and nothing carries over to the next step
    engine = type("Engine", (), {"total_loss": None, "device": torch.device("cpu"), "module": torch.nn.Linear(2, 1)})()
    g = guard.StepGuard(engine, rank=0, world_size=1, emit=lambda *a, **k: None)
    for loss in (torch.tensor(1.0), torch.tensor([2.0, float("inf")]), torch.tensor(3.0)):
        g.note_loss(loss)
    assert int(g.local_code()) == guard.LOSS
    assert int(g.local_code()) == 0  # cleared
    g.note_loss(torch.tensor(1.0))
    assert int(g.local_code()) == 0
    g.note_loss(float("nan"))
    assert int(g.local_code()) == guard.LOSS
    g.note_loss(torch.tensor(float("nan"), dtype=torch.bfloat16))
    g.note_loss(torch.tensor(1.0))
    assert g.agree() == [guard.LOSS]
    assert g.agree() == [0]


def test_the_poisoned_loss_keeps_a_finite_loss_and_its_gradients_and_makes_a_bad_ones_nan():
    w = torch.nn.Parameter(torch.tensor([0.3, -1.7, 2.5]))
    (w * w).sum().backward()
    plain = w.grad.clone()
    w.grad = None
    loss = (w * w).sum()
    assert torch.equal(guard.poisoned(loss), loss)
    guard.poisoned(loss).backward()
    assert torch.equal(w.grad, plain)  # bit for bit
    for bad in (float("inf"), float("nan")):
        w.grad = None
        guard.poisoned((w * w).sum() + bad).backward()  # the loss's own gradients are finite
        assert torch.isnan(w.grad).all(), bad
    assert guard.poisoned(1.5) == 1.5


def test_only_a_zero_optimizer_known_to_skip_non_finite_gradients_is_left_to_decide():
    import types

    class Zero12:  # DeepSpeedZeroOptimizer's attributes the check reads
        def __init__(self, dtype, check=False, norm=True):
            self.overflow, self.dtype, self.check_grad_overflow, self.compute_grad_norm = False, dtype, check, norm

    class Zero3:
        def __init__(self, dtype):
            self.overflow, self.dtype = False, dtype

    def where(cls, checks_norm):  # the optimizer's module: releases that check the norm import the test
        module = types.ModuleType(f"fake_zero_{cls.__name__}_{checks_norm}")
        if checks_norm:
            module.is_invalid_grad_norm = lambda norm: False
        sys.modules[module.__name__] = module
        return type(cls.__name__, (cls,), {"__module__": module.__name__})

    skips = guard.zero_skips_non_finite
    for checks_norm in (True, False):
        assert skips(where(Zero12, checks_norm)(torch.bfloat16, check=True))  # bf16's check_grad_overflow
        assert skips(where(Zero12, checks_norm)(torch.float16, check=True))
        assert not skips(where(Zero12, checks_norm)(torch.bfloat16, check=False))  # the user turned it off
        assert skips(where(Zero3, checks_norm)(torch.float16))
    assert skips(where(Zero12, True)(torch.float32))
    assert not skips(where(Zero12, True)(torch.float32, norm=False))  # compute_grad_norm=false: nothing checks
    assert not skips(where(Zero12, False)(torch.float32))  # 0.19.0-0.19.5: the norm is not checked
    assert skips(where(Zero3, True)(torch.float32)) and skips(where(Zero3, True)(torch.bfloat16))
    assert not skips(where(Zero3, False)(torch.bfloat16))
    patched = where(Zero3, False)(torch.bfloat16)
    patched._raytrain_checks_overflow = True  # deepspeed_compat's check on 0.18
    assert skips(patched)
    assert not skips(None) and not skips(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.1))
