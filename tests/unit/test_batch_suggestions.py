"""A refused batch suggests a global batch that passes every check: each suggestion is fed back and must
resolve (the elastic range's suggestion used to fail the next check when --grad-accum or --micro-batch was
given)."""
from __future__ import annotations

import json
import re

import pytest

from raytrain.config import Options, resolve
from raytrain.errors import ConfigError
from tests.unit.test_resolve import CNN

CASES = [
    dict(workers="2-4", grad_accum=2),
    dict(workers="2-4", grad_accum=2, train_batch=12),
    dict(workers="2-3", micro_batch=2, train_batch=8),
    dict(workers="2-4", micro_batch=1, grad_accum=1),
    dict(workers="2-4", micro_batch=3),
    dict(workers="3-5", train_batch=7),
    dict(workers=3, micro_batch=2, train_batch=10),
    dict(workers=3, grad_accum=4, train_batch=10),
    dict(workers=2, micro_batch=2, grad_accum=2, train_batch=10),
]


def _apply(error: str, given: dict) -> dict:
    """The options with the error's suggestion applied, as a user would."""
    match = re.search(r"use --train-batch (\d+)( and drop --grad-accum)?", error)
    assert match, error
    out = {**given, "train_batch": int(match.group(1))}
    if match.group(2):
        out.pop("grad_accum")
    return out


@pytest.mark.parametrize("given", CASES, ids=lambda c: " ".join(f"{k}={v}" for k, v in c.items()))
def test_the_suggested_train_batch_passes_every_check(given):
    with pytest.raises(ConfigError) as err:
        resolve(Options(job=CNN, **given))
    fixed = _apply(str(err.value), given)
    plan = resolve(Options(job=CNN, **fixed))  # no ConfigError: the suggestion works
    assert plan.train_batch == fixed["train_batch"]


def test_a_ds_config_batch_is_blamed_on_the_config_and_its_suggestion_works(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_batch_size": 8, "gradient_accumulation_steps": 2}))
    with pytest.raises(ConfigError) as err:
        resolve(Options(job=CNN, workers=3, ds_config=str(ds)))
    assert err.value.flag == "--ds-config" and "--train-batch" not in str(err.value)
    assert str(err.value).startswith(f"--ds-config {ds}: train_batch_size 8 is not divisible by grad-accum 2")
    value = int(re.search(r"use train_batch_size (\d+) in", str(err.value)).group(1))
    ds.write_text(json.dumps({"train_batch_size": value, "gradient_accumulation_steps": 2}))
    assert resolve(Options(job=CNN, workers=3, ds_config=str(ds))).train_batch == value


def test_a_ds_config_micro_batch_of_zero_names_the_config_key(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 0}))
    with pytest.raises(ConfigError) as err:
        resolve(Options(job=CNN, ds_config=str(ds)))
    assert err.value.flag == "--ds-config"
    assert str(err.value).startswith(f"--ds-config {ds}: train_micro_batch_size_per_gpu 0: must be an integer >= 1")
