"""--grad-clip: clipping is a visible choice, always in the DeepSpeed dict of a train(ctx) job (issue 20)."""
import json

import pytest

from raytrain.config import Options, load_profile, resolve
from raytrain.errors import ConfigError
from tests.conftest import JOBS, ROOT

CNN = str(JOBS / "cnn.py")
SCRIPT = str(ROOT / "tests" / "e2e" / "scripts" / "ds_regression.py")


def ds_file(tmp_path, data):
    p = tmp_path / "ds.json"
    p.write_text(json.dumps(data))
    return str(p)


def test_default_is_written_and_zero_turns_it_off():
    assert resolve(Options(job=CNN)).deepspeed["gradient_clipping"] == 1.0
    assert resolve(Options(job=CNN, grad_clip=0)).deepspeed["gradient_clipping"] == 0.0
    assert resolve(Options(job=CNN, grad_clip=0.5)).deepspeed["gradient_clipping"] == 0.5


def test_ds_config_gives_it_when_the_flag_does_not(tmp_path):
    path = ds_file(tmp_path, {"gradient_clipping": 0.25})
    assert resolve(Options(job=CNN, ds_config=path)).deepspeed["gradient_clipping"] == 0.25
    assert resolve(Options(job=CNN, ds_config=path, grad_clip=0.25)).deepspeed["gradient_clipping"] == 0.25


def test_a_flag_that_contradicts_the_ds_config_is_refused(tmp_path):
    path = ds_file(tmp_path, {"gradient_clipping": 0.25})
    with pytest.raises(ConfigError) as err:
        resolve(Options(job=CNN, ds_config=path, grad_clip=1.0))
    assert err.value.flag == "--grad-clip" and "gradient_clipping = 0.25" in str(err.value)


def test_negative_is_refused_naming_the_flag():
    with pytest.raises(ConfigError) as err:
        resolve(Options(job=CNN, grad_clip=-1))
    assert err.value.flag == "--grad-clip" and ">= 0" in str(err.value)


def test_profile_key(tmp_path):
    profile = tmp_path / "p.yaml"
    profile.write_text("grad-clip: 2.0\n")
    opts = Options(job=CNN).merged_over(load_profile(str(profile)))
    assert resolve(opts).deepspeed["gradient_clipping"] == 2.0


def test_a_script_keeps_its_own_clipping_unless_given():
    assert "gradient_clipping" not in resolve(Options(job=SCRIPT)).deepspeed
    assert resolve(Options(job=SCRIPT, grad_clip=0.0)).deepspeed["gradient_clipping"] == 0.0
