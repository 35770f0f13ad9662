"""DeepSpeed 0.18.x's defects that raytrain fixes on the engine (runtime/worker/deepspeed_compat.py).

The all-gather test builds, with real torch, exactly what 0.18's ZeRO-1/2 optimizer builds (a flat buffer of the
parameters with autograd history, and per-rank partitions of it), and runs gloo's all-gather into it in two
real processes: it fails the way 0.18's optimizer step does, and passes after ``fix_engine``. It needs no
particular DeepSpeed release installed (the version is passed in).
"""
import json
import os
import socket
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from raytrain.runtime.worker import deepspeed_compat

RANKS = textwrap.dedent("""
    import json, sys
    from types import SimpleNamespace
    import torch, torch.distributed as dist
    from torch._utils import _flatten_dense_tensors
    from raytrain.runtime.worker.deepspeed_compat import fix_engine
    rank, port, fix = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "fix"
    dist.init_process_group("gloo", rank=rank, world_size=2, init_method="tcp://127.0.0.1:" + port)
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(3, 2)), torch.nn.Parameter(torch.randn(2))]
    flat = _flatten_dense_tensors(params)  # what 0.18 builds: with autograd history
    parts = [flat.narrow(0, 0, 4), flat.narrow(0, 4, 4)]
    optimizer = SimpleNamespace(bit16_groups_flat=[flat], parallel_partitioned_bit16_groups=[parts])
    done = fix_engine(SimpleNamespace(optimizer=optimizer), "0.18.9") if fix else []
    flat, parts = optimizer.bit16_groups_flat[0], optimizer.parallel_partitioned_bit16_groups[0]
    parts[rank].data.fill_(rank + 1.0)  # this rank's updated partition
    try:
        dist.all_gather_into_tensor(flat, parts[rank])
        out = {"ok": True, "flat": flat.tolist(), "done": done}
    except RuntimeError as exc:
        out = {"ok": False, "error": str(exc)}
    print("@@result " + json.dumps(out), flush=True)
    dist.destroy_process_group()
""")


def _two_ranks(tmp_path, mode):
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), port, mode], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env) for r in (0, 1)]
    outs = [p.communicate(timeout=110)[0] for p in procs]
    return [json.loads(next(l for l in out.splitlines() if l.startswith("@@result "))[9:]) for out in outs]


@pytest.mark.timeout(120)
def test_gloo_all_gather_into_018s_flat_buffer_fails_without_the_fix_and_works_with_it(tmp_path):
    for res in _two_ranks(tmp_path, "plain"):
        assert not res["ok"] and "is a view and is being modified inplace" in res["error"], res
    for res in _two_ranks(tmp_path, "fix"):
        assert res["ok"] and res["flat"] == [1.0] * 4 + [2.0] * 4, res
        assert res["done"] == ["detached flat buffers"], res


def test_only_releases_before_0_19_are_changed():
    assert deepspeed_compat.needs_fixes("0.18.9") and deepspeed_compat.needs_fixes("0.18.0+abc")
    assert not deepspeed_compat.needs_fixes("0.19.8") and not deepspeed_compat.needs_fixes("0.20.0")
    flat = torch.zeros(4, requires_grad=True) * 1
    optimizer = SimpleNamespace(bit16_groups_flat=[flat], parallel_partitioned_bit16_groups=[[flat[:2], flat[2:]]],
                                check_grad_overflow=False, check_overflow=lambda: None)
    assert deepspeed_compat.fix_engine(SimpleNamespace(optimizer=optimizer), "0.19.8") == []
    assert optimizer.bit16_groups_flat[0] is flat and not optimizer.check_grad_overflow


def test_018s_zero_optimizers_check_non_finite_gradients_as_019s_do():
    """ZeRO-1/2: the optimizer's own flag (its step then runs check_overflow and skips); ZeRO-3: the check
    runs before its overflow handling. fp16, which 0.18 checks already, is left alone."""
    zero12 = SimpleNamespace(dtype=torch.float32, check_grad_overflow=False, check_overflow=lambda: None)
    assert deepspeed_compat.fix_engine(SimpleNamespace(optimizer=zero12), "0.18.9") == ["non-finite gradient check"]
    assert zero12.check_grad_overflow is True
    calls = []
    zero3 = SimpleNamespace(dtype=torch.bfloat16, overflow=False)
    zero3.check_overflow = lambda: (calls.append("check"), setattr(zero3, "overflow", True))
    zero3._overflow_check_and_loss_scale_update = lambda: (calls.append("update"), zero3.overflow)[1]
    assert deepspeed_compat.fix_engine(SimpleNamespace(optimizer=zero3), "0.18.9") == ["non-finite gradient check"]
    assert zero3._overflow_check_and_loss_scale_update() is True and calls == ["check", "update"]
    fp16 = SimpleNamespace(dtype=torch.float16, overflow=False, check_overflow=lambda: None,
                           _overflow_check_and_loss_scale_update=lambda: False)
    assert deepspeed_compat.fix_engine(SimpleNamespace(optimizer=fp16), "0.18.9") == []
