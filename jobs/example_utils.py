"""Helpers the example jobs share (a job's sibling modules ship with it and import normally)."""
import argparse
import os
import time

import torch


def batch_generator(seed: int, rank: int, step: int, micro: int) -> torch.Generator:
    """A generator for one micro-batch, a pure function of (seed, rank, step, micro-step): the data stream
    continues exactly where it stopped after a resume, with no sampler state to save."""
    return torch.Generator().manual_seed(((seed * 1_000_003 + rank) * 1_000_003 + step) * 1_000 + micro)


def add_fault_tolerance_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fail-once-at-step", type=int, default=0,
                        help="rank 1 (or 0 with one worker) dies at this step unless the run was restored: "
                             "try --max-failures")
    parser.add_argument("--fail-in-collective-at-step", type=int, default=0,
                        help="like --fail-once-at-step, but the rank dies as its backward of this step begins, "
                             "so the other ranks are inside the step's gradient collectives when it dies")
    parser.add_argument("--hold-at-step", type=int, default=0,
                        help="after this step every rank waits (up to 600 s) to be stopped: a test's handshake "
                             "point for `jobs stop`")
    parser.add_argument("--preempt-handshake", default="",
                        help="DIR:STEP: after STEP (first attempt only) every rank writes DIR/rank-N.json (its "
                             "process id and node) and waits (up to 300 s) until a rank has a preemption notice "
                             "(SIGTERM, a node drain): a test's handshake point")
    parser.add_argument("--step-sleep", type=float, default=0.0, help="seconds to sleep after each step")
    parser.add_argument("--probe-out", default="", help="rank 0 saves the model's outputs on a fixed input here")


def after_step(ctx, args, step: int) -> None:
    if args.step_sleep:
        time.sleep(args.step_sleep)
    if getattr(args, "hold_at_step", 0) and step == args.hold_at_step:
        time.sleep(600)  # until `jobs stop`; bounded so a test that never stops it cannot hold a CPU for good
    if getattr(args, "preempt_handshake", "") and ctx.resumed_from is None:
        wait_for_preemption(ctx, args.preempt_handshake, step)
    if args.fail_once_at_step and step == args.fail_once_at_step and ctx.resumed_from is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            # every rank has finished and reported this step before the crash: without it, the dying rank's
            # closed sockets could fail rank 0 still inside the step's last collective, and whether the step
            # was reported would depend on timing
            dist.barrier()
        if ctx.rank == min(1, ctx.world_size - 1):
            print(f"rank {ctx.rank}: simulated crash at step {step}", flush=True)
            os._exit(1)  # a real process death, not an exception


def wait_for_preemption(ctx, handshake: str, step: int) -> None:
    """``--preempt-handshake DIR:STEP``: after STEP every rank writes DIR/rank-N.json (its pid and node) and
    waits (up to 300 s) until some rank has a preemption notice: the rank that gets it writes DIR/notice."""
    folder, _, at = handshake.rpartition(":")
    if step != int(at):
        return
    import json

    import ray

    from raytrain.runtime.worker import preemption

    path = os.path.join(folder, f"rank-{ctx.rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"rank": ctx.rank, "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                   "ip": ray.util.get_node_ip_address(), "step": step}, f)
    os.replace(path + ".tmp", path)
    notice = os.path.join(folder, "notice")
    deadline = time.monotonic() + 300
    while not os.path.exists(notice) and time.monotonic() < deadline:
        if preemption.current() is not None:
            with open(notice, "w") as f:
                f.write(f"rank {ctx.rank}: {preemption.current().reason}\n")
            break
        time.sleep(0.05)


def before_backward(ctx, args, step: int, micro: int, loss: torch.Tensor) -> None:
    """``--fail-in-collective-at-step``: the dying rank exits from a hook on its loss's gradient, the first
    thing its backward runs, while the other ranks go on into the backward's gradient reduction (ZeRO's
    reduce-scatter / all-reduce) and meet a peer that is gone in the middle of it. No barrier: the step is
    reported by no rank. ``step`` counts from 1, as reported."""
    n = getattr(args, "fail_in_collective_at_step", 0)
    if not n or step != n or micro != 0 or ctx.resumed_from is not None or ctx.rank != min(1, ctx.world_size - 1):
        return

    def die(grad):
        print(f"rank {ctx.rank}: simulated crash inside a collective at step {step}", flush=True)
        os._exit(1)

    loss.register_hook(die)


def save_probe(ctx, engine, args, probe: torch.Tensor) -> None:
    """Every rank runs the forward (ZeRO-3 gathers parameters collectively); rank 0 saves the outputs."""
    if not args.probe_out:
        return
    with torch.no_grad():
        out = engine(probe.to(ctx.device))
    if ctx.is_main:
        torch.save({"input": probe.cpu(), "output": out.float().cpu()}, args.probe_out)
