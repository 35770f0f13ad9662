"""The NCCL flight recorder (raytrain.flight_recorder): on for CUDA workers only, dumps into the run's record,
the user's own values kept; shown by every target's dry run."""
import pytest

from raytrain import flight_recorder as fr
from raytrain.config import Options, resolve
from tests.conftest import JOBS
from tests.unit.test_targets import _address, _local, _port_forward, _rayjob


def plan(**options):
    return resolve(Options(job=str(JOBS / "cnn.py"), workers=2, **options), cluster_has_gpus=True)


def test_cuda_workers_get_the_recorder_with_dumps_in_the_runs_record(tmp_path):
    env = fr.env_vars(plan(gpus_per_worker=1, storage=str(tmp_path)), "run-1")
    assert env == {fr.TRACE_BUFFER: "2000", fr.DUMP_ON_TIMEOUT: "1",
                   fr.DUMP_FILE: str(tmp_path / "run-1" / "raytrain" / "nccl" / "rank-")}
    assert fr.env_vars(plan(gpus_per_worker=0, storage=str(tmp_path)), "run-1") == {}  # CPU workers: no NCCL
    # a storage that is not a path: each node's own disk
    assert fr.env_vars(plan(gpus_per_worker=1, storage="s3://b/p"), "r")[fr.DUMP_FILE] == "/tmp/raytrain-nccl/r/rank-"
    # what the user sets is kept: only the others are added
    kept = fr.env_vars(plan(gpus_per_worker=1, storage=str(tmp_path)), "r", given={fr.TRACE_BUFFER, fr.DUMP_FILE})
    assert kept == {fr.DUMP_ON_TIMEOUT: "1"}


def test_a_worker_makes_the_dump_folder_and_the_cli_finds_the_dumps(tmp_path):
    prefix = tmp_path / "run" / "raytrain" / "nccl" / "rank-"
    assert fr.prepare({fr.DUMP_FILE: str(prefix), fr.DUMP_ON_TIMEOUT: "1"}) == prefix.parent
    assert prefix.parent.is_dir()
    assert fr.prepare({}) is None
    assert fr.dumps(tmp_path / "run" / "raytrain") == []
    (prefix.parent / "rank-1").write_bytes(b"pickle")
    assert fr.dumps(tmp_path / "run" / "raytrain") == [prefix.parent / "rank-1"]


@pytest.mark.parametrize("make", [_local, _address, _rayjob, _port_forward])
def test_the_dry_run_shows_the_recorder_for_gpu_workers_only(make, raytrain_home, tmp_path):
    def env_vars(**options):
        return make(tmp_path).dry_run(plan(**options)).runtime_env["env_vars"]

    gpu = env_vars(gpus_per_worker=1)
    assert gpu[fr.TRACE_BUFFER] == "2000" and gpu[fr.DUMP_ON_TIMEOUT] == "1"
    assert gpu[fr.DUMP_FILE].endswith("/nccl/rank-") or gpu[fr.DUMP_FILE].startswith(fr.NODE_LOCAL)
    assert not {fr.TRACE_BUFFER, fr.DUMP_ON_TIMEOUT, fr.DUMP_FILE} & set(env_vars(gpus_per_worker=0))
    mine = env_vars(gpus_per_worker=1, env={fr.TRACE_BUFFER: "0"})
    assert mine[fr.TRACE_BUFFER] == "0"  # --env wins
