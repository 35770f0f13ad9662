"""Script mode, worker side without Ray: launcher environment, command line, init_process_group reuse,
exit statuses; one test runs 2 real processes on gloo the way Ray Train leaves them."""
import importlib
import argparse
import json
import os
import pickle
import socket
import sys
import textwrap
import types

import pytest

from raytrain.runtime.worker import script as sm
from raytrain.runtime.worker.script import Launch, ScriptExit, injected_args, launcher_env, run_script

CFG = "/tmp/raytrain-script-x/ds_config.json"
DS = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}


def ds_parser():
    """What deepspeed.add_config_arguments adds (DeepSpeedExamples), plus the launcher's --local_rank."""
    p = argparse.ArgumentParser()
    p.add_argument("--local_rank", type=int, default=-1)
    p.add_argument("--steps", type=int, default=1)
    group = p.add_argument_group("DeepSpeed")
    group.add_argument("--deepspeed", default=False, action="store_true")
    group.add_argument("--deepspeed_config", default=None, type=str)
    group.add_argument("--deepscale", default=False, action="store_true")
    group.add_argument("--deepscale_config", default=None, type=str)
    return p


def hf_parser():
    """Hugging Face TrainingArguments: --deepspeed takes the config path."""
    p = argparse.ArgumentParser()
    p.add_argument("--output_dir")
    p.add_argument("--deepspeed", type=str, default=None)
    p.add_argument("--local_rank", type=int, default=-1)
    return p


def test_launcher_env():
    env = launcher_env(Launch(rank=5, local_rank=1, world_size=8, local_world_size=4, node_rank=1,
                              master_addr="10.0.0.1", master_port=29500))
    assert env == {
        "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
        "NODE_RANK": "1", "LOCAL_SIZE": "4", "CROSS_RANK": "1", "CROSS_SIZE": "2",
        "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
    }


@pytest.mark.parametrize(
    "parser, cmdline, expected",
    [
        (ds_parser, ["--steps", "3"], ["--local_rank=1", "--deepspeed", "--deepspeed_config", CFG]),
        (ds_parser, ["--deepspeed"], ["--local_rank=1", "--deepspeed_config", CFG]),  # the user's switch stays
        (ds_parser, ["--local_rank", "0"], ["--deepspeed", "--deepspeed_config", CFG]),
        (ds_parser, ["--deepspeed_config", "mine.json"], ["--local_rank=1"]),  # the user's (merged) config
        (hf_parser, ["--output_dir", "o"], ["--local_rank=1", "--deepspeed", CFG]),
        (hf_parser, ["--deepspeed", "z.json"], ["--local_rank=1"]),
        (lambda: argparse.ArgumentParser(), [], []),  # a plain torchrun parser gets nothing
    ],
)
def test_injected_args_follow_the_parser(parser, cmdline, expected):
    p = parser()
    extra = injected_args(p._option_string_actions, cmdline, config_path=CFG, local_rank=1)
    assert extra == expected
    p.parse_args(extra + cmdline)  # argparse accepts every injected option


def test_injected_local_rank_uses_the_parsers_spelling():
    p = argparse.ArgumentParser()
    p.add_argument("--local-rank", type=int)
    assert injected_args(p._option_string_actions, [], config_path=None, local_rank=3) == ["--local-rank=3"]
    assert p.parse_args(["--local-rank=3"]).local_rank == 3


def test_backend_compatibility():
    assert sm._backends("gloo") & sm._backends("gloo")
    assert sm._backends("cpu:gloo,cuda:nccl") & sm._backends("nccl")
    assert not sm._backends("nccl") & sm._backends("gloo")


# -- running a script in this process -----------------------------------------------------------------
def run(tmp_path, source, args=(), *, launch=None, ds=DS, name="train.py"):
    folder = tmp_path / "job"
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(source))
    launch = launch or Launch(rank=0, local_rank=0, world_size=1, local_world_size=1, master_addr="127.0.0.1",
                              master_port=29999)
    run_script(path, list(args), launch=launch, deepspeed_config=ds)
    return folder


REPORT = """
    import argparse, json, os, sys
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--deepspeed", action="store_true")
    parser.add_argument("--deepspeed_config")
    args = parser.parse_args()
    explicit = parser.parse_args(["--steps", "9"])  # explicit args are the script's business
    out = {
        "args": vars(args), "explicit": vars(explicit), "argv": sys.argv, "cwd": os.getcwd(),
        "name": __name__, "path0": sys.path[0],
        "config": json.load(open(args.deepspeed_config)) if args.deepspeed_config else None,
        "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                               "RAYTRAIN_DEEPSPEED_CONFIG")},
    }
    json.dump(out, open("report.json", "w"))
"""


@pytest.fixture
def restored():
    """Everything run_script patches is back afterwards."""
    import torch.distributed as dist

    before = (list(sys.argv), list(sys.path), os.getcwd(), argparse.ArgumentParser.parse_known_args,
              dist.init_process_group, sys.modules.get("__main__"))
    env = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()  # run_script sets the launcher's variables for the rest of the (worker) process
        os.environ.update(env)
    after = (list(sys.argv), list(sys.path), os.getcwd(), argparse.ArgumentParser.parse_known_args,
             dist.init_process_group, sys.modules.get("__main__"))
    assert after == before


def test_a_launcher_script_gets_env_argv_local_rank_and_config(tmp_path, restored):
    folder = run(tmp_path, REPORT, ["--steps", "3"])
    out = json.loads((folder / "report.json").read_text())
    assert out["name"] == "__main__" and out["cwd"] == str(folder) and out["path0"] == str(folder)
    assert out["argv"] == [str(folder / "train.py"), "--steps", "3"]  # sys.argv stays the user's
    assert out["args"]["steps"] == 3 and out["args"]["local_rank"] == 0 and out["args"]["deepspeed"] is True
    assert out["config"] == DS and out["env"]["RAYTRAIN_DEEPSPEED_CONFIG"] == out["args"]["deepspeed_config"]
    assert not os.path.exists(out["args"]["deepspeed_config"])  # the temp file is gone afterwards
    assert out["explicit"]["local_rank"] == -1 and out["explicit"]["deepspeed_config"] is None
    assert out["env"] | {"RAYTRAIN_DEEPSPEED_CONFIG": None} == {
        "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999",
        "RAYTRAIN_DEEPSPEED_CONFIG": None,
    }


def test_the_users_config_argument_points_at_the_merged_copy(tmp_path, restored):
    folder = run(tmp_path, REPORT, ["--deepspeed_config", "ds.json"])
    out = json.loads((folder / "report.json").read_text())
    assert out["config"] == DS and out["args"]["deepspeed_config"] != "ds.json"
    assert out["args"]["deepspeed"] is False  # the user gave no --deepspeed: none is added
    assert out["argv"][1:] == ["--deepspeed_config", out["args"]["deepspeed_config"]]


def test_a_plain_parser_gets_no_unknown_options(tmp_path, restored, capsys):
    source = """
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--steps", type=int)
        assert parser.parse_args().steps == 2
    """
    run(tmp_path, source, ["--steps", "2"])
    assert "parsed no --deepspeed_config option" in capsys.readouterr().out
    run(tmp_path, source, ["--steps", "2"], launch=Launch(1, 1, 2, 2))
    assert "parsed no" not in capsys.readouterr().out  # rank 0 only


@pytest.mark.parametrize("code", ["sys.exit(0)", "sys.exit()", "raise SystemExit(None)", "pass"])
def test_a_clean_exit_is_success(tmp_path, restored, code):
    """The script runs up to its exit, the exit is not raised out of run_script, and nothing after it runs."""
    source = f"import sys\nopen('before', 'w').write('ran')\n{code}\nopen('after', 'w').write('ran')\n"
    folder = run(tmp_path, source)  # returns: no SystemExit, no ScriptExit
    assert (folder / "before").read_text() == "ran"
    assert (folder / "after").exists() == (code == "pass")


@pytest.mark.parametrize(
    "code, message",
    [("sys.exit(3)", "train.py exited with status 3 on rank 1"),
     ("sys.exit('no data in /x')", "train.py exited on rank 1: no data in /x")],
)
def test_a_failing_exit_fails_with_status_and_rank(tmp_path, restored, code, message):
    with pytest.raises(ScriptExit) as err:
        run(tmp_path, f"import sys\n{code}\n", launch=Launch(1, 1, 2, 2))
    assert str(err.value) == message
    assert isinstance(err.value.__context__, SystemExit) and err.value.__cause__ is None
    assert str(pickle.loads(pickle.dumps(err.value))) == message  # crosses Ray's actor boundary


def test_an_exception_propagates_unchanged(tmp_path, restored):
    with pytest.raises(ValueError, match="bad shard") as err:
        run(tmp_path, "def load():\n    raise ValueError('bad shard')\nload()\n")
    frames = [f.filename for f in __import__("traceback").extract_tb(err.value.__traceback__)]
    assert frames[-1].endswith("train.py")  # the script's own frames are in the traceback


def test_an_exception_class_of_the_script_survives_ray_serialization(tmp_path, ray_train, restored):
    """Ray sends a worker's exception to the controller with cloudpickle, which carries a class defined in
    the script (``__main__``) by value, after the run (when ``__main__`` is Ray's again)."""
    cloudpickle = importlib.import_module("ray.cloudpickle")
    source = "class DataError(Exception):\n    pass\n\nraise DataError('shard 3 is empty')\n"
    with pytest.raises(Exception) as err:
        run(tmp_path, source)
    copy = pickle.loads(cloudpickle.dumps(err.value))
    assert type(copy).__name__ == "DataError" and str(copy) == "shard 3 is empty"


def test_driver_reports_the_rank_and_root_cause_of_a_script_exit():
    from raytrain.runtime.driver.entrypoint import _one_line, _root_cause

    class WorkerGroupError(Exception):  # the shape of Ray Train's error: worker_failures by rank
        def __init__(self, failures):
            super().__init__("workers failed")
            self.worker_failures = failures

    exc, rank = _root_cause(WorkerGroupError({1: ScriptExit("train.py exited with status 3 on rank 1")}))
    assert rank == 1 and type(exc).__name__ == "ScriptExit"
    assert _one_line(exc) == "train.py exited with status 3 on rank 1"
    # rank 0 only lost its peer in a collective: the failure is rank 1's (here: its process died)
    lost = RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:8628: Connection reset by peer.")
    exc, rank = _root_cause(WorkerGroupError({0: lost, 1: RuntimeError("A worker health check failed.")}))
    assert rank == 1 and str(exc) == "A worker health check failed."
    exc, rank = _root_cause(WorkerGroupError({0: lost, 1: lost}))  # nothing better known: the lowest rank
    assert rank == 0


# -- deepspeed hooks (a stand-in deepspeed: the real one is exercised by tests/e2e/test_scripts.py) ------
@pytest.fixture
def fake_deepspeed(monkeypatch):
    calls = []
    ds = types.ModuleType("deepspeed")
    ds.ops = types.SimpleNamespace(__compatible_ops__={"deepspeed_shm_comm": True})

    def initialize(args=None, model=None, optimizer=None, model_parameters=None, config=None, config_params=None):
        calls.append((getattr(args, "deepspeed_config", None), config))
        return "engine", None, None, None

    ds.initialize = initialize
    accel = types.ModuleType("deepspeed.accelerator")
    accel.get_accelerator = lambda: types.SimpleNamespace(device_name=lambda: "cpu")
    monkeypatch.setitem(sys.modules, "deepspeed", ds)
    monkeypatch.setitem(sys.modules, "deepspeed.accelerator", accel)
    monkeypatch.delenv("RAYTRAIN_DS_SHM_COMM", raising=False)
    return ds, calls


def test_deepspeed_hooks(fake_deepspeed, capsys):
    ds, calls = fake_deepspeed
    original = ds.initialize
    with sm.deepspeed_hooks(injected_config=CFG, log=print):
        assert ds.ops.__compatible_ops__["deepspeed_shm_comm"] is False  # no minutes of compiling on CPU
        ds.initialize(args=argparse.Namespace(deepspeed_config=CFG), model="m")
        ds.initialize(argparse.Namespace(deepspeed_config=CFG), "m", config={"train_batch_size": 1})
        ds.initialize(args=argparse.Namespace(deepspeed_config="mine.json"), config={"x": 1})
    assert ds.initialize is original
    assert calls == [(CFG, None), (None, {"train_batch_size": 1}), ("mine.json", {"x": 1})]
    assert "passes its own config to deepspeed.initialize()" in capsys.readouterr().out


def test_deepspeed_is_imported_only_for_scripts_that_use_it(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "deepspeed", raising=False)
    (tmp_path / "helpers.py").write_text("import deepspeed\n")
    (tmp_path / "other.py").write_text("import deepspeed\n")
    for name, source, expected in [
        ("plain.py", "import torch\nimport other_module\n", False),  # other.py is not imported
        ("ds.py", "import deepspeed\n", True),
        ("indirect.py", "from helpers import thing\n", True),
    ]:
        (tmp_path / name).write_text(source)
        assert sm.uses_deepspeed(tmp_path / name) is expected, name


# -- init_process_group on an initialised group: 2 real processes on gloo --------------------------------
DDP_SCRIPT = """
    import argparse, json, os
    import torch
    import torch.distributed as dist
    from torch.distributed import init_process_group

    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=-1)
    parser.add_argument("--tag")
    args = parser.parse_args()
    dist.init_process_group("gloo")                     # from env, as under torchrun: a no-op here
    init_process_group(backend="gloo", rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    dist.init_process_group()
    refused = []
    for kw in (dict(backend="nccl"), dict(backend="gloo", rank=7), dict(world_size=3)):
        try:
            dist.init_process_group(**kw)
        except RuntimeError as exc:
            refused.append(str(exc))
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)                                  # the group Ray Train made works
    env = {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                      "MASTER_PORT")}
    json.dump({"sum": t.item(), "env": env, "local_rank": args.local_rank, "tag": args.tag, "refused": refused},
              open(f"rank{dist.get_rank()}.json", "w"))
    dist.destroy_process_group()                        # torchrun scripts do; Ray Train's shutdown copes
    raise SystemExit(0)
"""


def _spawned_worker(rank, world, port, path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world)  # what Ray Train does before train_loop
    from raytrain.runtime.worker.script import _store_address

    addr, store_port = _store_address()
    assert (addr, store_port) == ("127.0.0.1", port), (addr, store_port)
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        del os.environ[key]  # run_script must give them back from the Launch
    run_script(path, ["--tag", "x"], launch=Launch(rank, rank, world, world, 0, addr, store_port),
               deepspeed_config=None)


def test_two_processes_reuse_the_initialised_group(tmp_path):
    import torch.multiprocessing as mp

    path = tmp_path / "ddp.py"
    path.write_text(textwrap.dedent(DDP_SCRIPT))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # fork: the children inherit the imported torch (spawn would import it again in each, seconds apiece)
    mp.start_processes(_spawned_worker, args=(2, port, str(path)), nprocs=2, join=True, start_method="fork")
    for rank in range(2):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert out["sum"] == 3.0 and out["local_rank"] == rank and out["tag"] == "x"
        assert out["env"] == {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        nccl, bad_rank, bad_world = out["refused"]
        assert "Ray Train already initialised the default process group with backend 'gloo'" in nccl
        assert "init_process_group(rank=7): this Ray Train worker has rank" in bad_rank
        assert "init_process_group(world_size=3)" in bad_world


@pytest.fixture
def ray_train():
    return importlib.import_module("ray.train")  # before `restored`: importing ray extends sys.path


def test_the_worker_dispatches_script_mode(tmp_path, ray_train, restored, monkeypatch):
    """train_loop_per_worker with plan["mode"] == "script": finds the file in the working_dir (on sys.path) and
    runs it with the place Ray Train's context gives."""
    from raytrain.config import Options, resolve
    from raytrain.runtime.worker.loop import train_loop_per_worker

    class Context:
        get_world_rank = staticmethod(lambda: 1)
        get_local_rank = staticmethod(lambda: 1)
        get_world_size = staticmethod(lambda: 2)
        get_local_world_size = staticmethod(lambda: 2)
        get_node_rank = staticmethod(lambda: 0)

    monkeypatch.setattr(ray_train, "get_context", lambda: Context())
    monkeypatch.setattr("gc.freeze", lambda: None)  # not pytest's own heap
    monkeypatch.setenv("RAYTRAIN_BIND_CORES", "0")  # nor pytest's own threads
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
    monkeypatch.setenv("MASTER_PORT", "1234")
    folder = tmp_path / "job"
    folder.mkdir()
    (folder / "train.py").write_text(textwrap.dedent(REPORT))
    plan = resolve(Options(job=str(folder / "train.py"), workers=2, micro_batch=4, job_args=["--steps", "5"]))
    assert plan.mode == "script"
    monkeypatch.syspath_prepend(str(folder))  # Ray puts the unpacked working_dir on sys.path
    monkeypatch.chdir(tmp_path)  # and Ray Train v2 moves the cwd elsewhere
    train_loop_per_worker({"plan": plan.to_dict()})
    out = json.loads((folder / "report.json").read_text())
    assert out["args"]["local_rank"] == 1 and out["args"]["steps"] == 5 and out["config"] == plan.deepspeed
    assert out["env"]["RANK"] == "1" and out["env"]["WORLD_SIZE"] == "2"
    assert (out["env"]["MASTER_ADDR"], out["env"]["MASTER_PORT"]) == ("10.1.2.3", "1234")
