"""raytrain.runtime.worker.engine.engine_facts on real DeepSpeed engines (one process, gloo): the facts are read
from what DeepSpeed built, so a layout flag lost on the way to the engine shows (the e2e layout tests
assert them for every layout)."""
import json
import os
import subprocess
import sys
import textwrap

from tests.conftest import ROOT, free_port

SCRIPT = textwrap.dedent('''
    import json, sys
    import torch
    import torch.distributed as dist
    from raytrain.runtime.worker.engine import build_engine, engine_facts

    dist.init_process_group("gloo", rank=0, world_size=1)
    out = {}
    for name, zero in (("z1", {"stage": 1}),
                       ("z2-offload", {"stage": 2, "offload_optimizer": {"device": "cpu"}}),
                       ("z3", {"stage": 3})):
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
        config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3,
                  "train_batch_size": 6, "zero_optimization": zero, "zero_force_ds_cpu_optimizer": False,
                  "zero_allow_untested_optimizer": True}
        engine = build_engine(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), config=config,
                              lr_scheduler=None, model_parameters=None)
        out[name] = engine_facts(engine)
        engine.destroy()
    print("@@facts " + json.dumps(out))
''')


def test_engine_facts_of_real_engines(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "DS_ACCELERATOR": "cpu", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("@@facts ")), None)
    assert proc.returncode == 0 and line, proc.stdout[-3000:] + proc.stderr[-3000:]
    facts = json.loads(line.removeprefix("@@facts "))
    common = {"precision": "fp32", "micro_batch": 2, "grad_accum": 3, "train_batch": 6, "dp": 1, "tp": 1,
              "tp_layers": 0, "pp": 1, "pipeline_checkpoint_interval": None, "offload_param": None}
    assert facts["z1"] == {**common, "zero_stage": 1, "offload_optimizer": None, "optimizer": "DeepSpeedZeroOptimizer"}
    assert facts["z2-offload"] == {**common, "zero_stage": 2, "offload_optimizer": "cpu",
                                   "optimizer": "DeepSpeedZeroOptimizer"}
    assert facts["z3"] == {**common, "zero_stage": 3, "offload_optimizer": None,
                           "optimizer": "DeepSpeedZeroOptimizer_Stage3"}
