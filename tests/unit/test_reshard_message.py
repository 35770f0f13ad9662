"""Resharding a ZeRO checkpoint to another number of workers goes through DeepSpeed's universal checkpoint,
which re-cuts Adam-family optimizer state only. An SGD checkpoint used to fail with DeepSpeed's bare
``KeyError: 'exp_avg'``; the job now says what happened and what would work."""
from raytrain.runtime.checkpoint.files import _conversion_failure

# The tail of `python -m deepspeed.checkpoint.ds_to_universal` (DeepSpeed 0.19.8) on a ZeRO-1 checkpoint saved
# by 2 ranks with torch.optim.SGD(momentum=0.9): reproduced with a real 2-process gloo run.
SGD_OUTPUT = """\
  File "/venv/lib/python3.11/site-packages/deepspeed/checkpoint/ds_to_universal.py", line 154, in extract_zero_shards
    exp_avg=state_groups[param_group_id]["exp_avg"],
            ~~~~~~~~~~~~~~~~~~~~~~~~~~~~^^^^^^^^^^^
KeyError: 'exp_avg'
"""


def test_a_non_adam_checkpoint_names_the_cause_and_the_way_out():
    msg = _conversion_failure("/storage/run/checkpoint_000002", SGD_OUTPUT, 2)
    assert "cannot be resharded" in msg and "not Adam's" in msg
    assert "Resume with --workers 2" in msg and "Adam/AdamW" in msg
    assert "Traceback" not in msg and "KeyError" not in msg


def test_another_conversion_failure_keeps_deepspeeds_last_lines():
    out = "\n".join(f"line {i}" for i in range(30)) + "\nOSError: disk full"
    msg = _conversion_failure("/storage/run/ckpt", out, 2)
    assert msg.startswith("raytrain: converting /storage/run/ckpt to a universal checkpoint failed:")
    assert msg.endswith("OSError: disk full") and "line 15" not in msg and "line 16" in msg
