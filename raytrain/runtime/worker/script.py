"""Script mode: run an unmodified deepspeed-launcher or torchrun script as ``__main__`` on every Ray Train worker.

What the script gets, as under the launchers:

- the environment: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK/NODE_RANK, MASTER_ADDR,
  MASTER_PORT (torchrun's names) and LOCAL_SIZE, CROSS_RANK, CROSS_SIZE (the deepspeed launcher's), from
  Ray Train's context and the process group Ray Train already initialised;
- ``sys.argv = [script, *SCRIPT_ARGS]``; its folder first on ``sys.path`` and as the current directory
  (relative paths in SCRIPT_ARGS resolve as if launched from the script's folder);
- raytrain's resolved DeepSpeed config as a JSON file (also in ``$RAYTRAIN_DEEPSPEED_CONFIG``), passed the
  launcher way: ``--deepspeed --deepspeed_config PATH`` (``--deepspeed PATH`` for a Hugging Face parser),
  and ``--local_rank=N``, each only *if the script's own parser accepts it*. raytrain decides that with the
  parser the script builds rather than by scanning its source: while the script runs,
  ``argparse.ArgumentParser.parse_known_args`` (which ``parse_args`` calls) adds to the command line of a
  parser that parses ``sys.argv`` the options that this parser defines (from its option table). So a
  parser built in a helper module works, a plain torchrun parser without these options gets nothing extra
  (no "unrecognized arguments"), and ``sys.argv`` itself stays the user's. A DeepSpeed config the user
  gives in SCRIPT_ARGS was merged with raytrain's flags by the CLI (raytrain.config.script_args); the
  workers pass the merged copy in its place and add no config of their own.
- ``torch.distributed.init_process_group`` is a no-op while the default group (Ray Train's) exists and the
  requested backend is compatible (``deepspeed.init_distributed`` already is); a different backend, rank or
  world size is refused with the reason.
- ``sys.exit(0)``/``SystemExit(None)`` is success; a non-zero exit raises ScriptExit (the job fails with
  the status and the rank); any other exception propagates with the script's traceback (Ray pickles it
  with cloudpickle, which carries a class the script defines by value).

Limits: the script runs in Ray Train's training thread, so ``signal.signal`` in the script fails, and
``os._exit`` ends the worker process (Ray reports the actor's death).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import inspect
import json
import os
import runpy
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from raytrain.config.plan import Plan
from raytrain.config.script_args import (
    CONFIG_FLAGS, HF_FLAG, find_config_arg, gives_option, mentions, replace_config_args,
)
from raytrain.runtime.worker.job_import import find_job_file

ENV_CONFIG = "RAYTRAIN_DEEPSPEED_CONFIG"
LOCAL_RANK_FLAGS = ("--local_rank", "--local-rank")


class ScriptExit(RuntimeError):
    """The script called ``sys.exit`` with a non-zero status."""


@dataclass(frozen=True)
class Launch:
    """This worker's place, as a launcher would describe it."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int | str | None = None


def launcher_env(launch: Launch) -> dict[str, str]:
    """The environment torchrun and the deepspeed launcher give each process."""
    env = {
        "RANK": launch.rank,
        "LOCAL_RANK": launch.local_rank,
        "WORLD_SIZE": launch.world_size,
        "LOCAL_WORLD_SIZE": launch.local_world_size,
        "GROUP_RANK": launch.node_rank,
        "NODE_RANK": launch.node_rank,
        "LOCAL_SIZE": launch.local_world_size,
        "CROSS_RANK": launch.node_rank,
    }
    if launch.local_world_size and launch.world_size % launch.local_world_size == 0:
        env["CROSS_SIZE"] = launch.world_size // launch.local_world_size
    if launch.master_addr:
        env["MASTER_ADDR"] = launch.master_addr
    if launch.master_port:
        env["MASTER_PORT"] = launch.master_port
    return {key: str(value) for key, value in env.items()}


# -- the command line -----------------------------------------------------------------------------------
def injected_args(
    actions: Mapping[str, argparse.Action], cmdline: list[str], *, config_path: str | None, local_rank: int | None,
    defaults: Mapping[str, str] | None = None,
) -> list[str]:
    """What raytrain adds to ``cmdline`` for a parser whose options are ``actions`` (option string -> action):
    ``--local_rank=N`` if it has that option, the DeepSpeed config if it takes one and the user gave
    none, and each of ``defaults`` (``{"--per_device_train_batch_size": "8"}``: a Trainer script's
    arguments raytrain resolved) the user did not give. Only options the parser defines, so argparse never
    sees an unknown one."""
    out: list[str] = []
    for name, value in (defaults or {}).items():
        if name in actions and not gives_option(cmdline, name):
            out.append(f"{name}={value}")
    if local_rank is not None and not gives_option(cmdline, *LOCAL_RANK_FLAGS):
        name = next((n for n in LOCAL_RANK_FLAGS if n in actions), None)
        if name:
            out.append(f"{name}={local_rank}")
    if config_path and find_config_arg(cmdline) is None:
        config_flag = next((f for f in CONFIG_FLAGS if f in actions), None)
        switch = actions.get(HF_FLAG)
        if config_flag:  # DeepSpeed's add_config_arguments: --deepspeed (a switch) --deepspeed_config PATH
            if switch is not None and switch.nargs == 0 and not gives_option(cmdline, HF_FLAG, "--deepscale"):
                out.append(HF_FLAG)
            out += [config_flag, config_path]
        elif switch is not None and switch.nargs != 0 and not gives_option(cmdline, HF_FLAG):
            out += [HF_FLAG, config_path]  # Hugging Face TrainingArguments: --deepspeed PATH
    return out


@contextlib.contextmanager
def argparse_hook(
    *, config_path: str | None, local_rank: int | None, delivered: set[str], defaults: Mapping[str, str] | None = None
) -> Iterator[None]:
    """While active, a parser that parses the command line (``args`` None or exactly ``sys.argv[1:]``) gets
    ``injected_args`` for its own options in front (where the deepspeed launcher puts --local_rank).
    The options delivered are added to ``delivered``."""
    original = argparse.ArgumentParser.parse_known_args

    @functools.wraps(original)
    def parse_known_args(self, args=None, namespace=None):
        cmdline = sys.argv[1:]
        if args is not None:
            args = list(args)
        if args is None or args == cmdline:
            extra = injected_args(
                self._option_string_actions, cmdline, config_path=config_path, local_rank=local_rank,
                defaults=defaults,
            )
            delivered.update(token.partition("=")[0] for token in extra if token.startswith("--"))
            args = extra + cmdline
        return original(self, args, namespace)

    argparse.ArgumentParser.parse_known_args = parse_known_args
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_known_args = original


# -- torch.distributed ----------------------------------------------------------------------------------
def _backends(name: Any) -> set[str]:
    """{"gloo"} for "gloo", {"gloo", "nccl"} for "cpu:gloo,cuda:nccl"."""
    return {part.split(":")[-1].strip().lower() for part in str(name).split(",") if part.strip()}


@contextlib.contextmanager
def reuse_process_group() -> Iterator[None]:
    """``init_process_group`` returns at once while a default group exists with a compatible backend (Ray
    Train's), instead of failing with "trying to initialize the default process group twice"."""
    import torch.distributed as dist

    if not dist.is_available():
        yield
        return
    from torch.distributed import distributed_c10d as c10d

    original = c10d.init_process_group
    try:
        signature = inspect.signature(original)
    except (TypeError, ValueError):
        signature = None

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> None:
        if not dist.is_initialized():
            return original(*args, **kwargs)
        given: dict[str, Any] = dict(kwargs)
        if signature is not None:
            try:
                given = dict(signature.bind_partial(*args, **kwargs).arguments)
            except TypeError:
                pass
        current = dist.get_backend()
        backend = given.get("backend")
        if backend not in (None, "", "undefined") and not (_backends(backend) & _backends(current)):
            raise RuntimeError(
                f"init_process_group(backend={str(backend)!r}): Ray Train already initialised the default "
                f"process group with backend {current!r} ({'GPU' if 'nccl' in _backends(current) else 'CPU'} "
                f"workers); raytrain reuses it, so ask for {current!r} or none (or choose the workers' kind "
                "with --gpus-per-worker)"
            )
        for key, actual in (("rank", dist.get_rank()), ("world_size", dist.get_world_size())):
            value = given.get(key)
            if value not in (None, -1) and int(value) != actual:
                raise RuntimeError(
                    f"init_process_group({key}={value}): this Ray Train worker has {key} {actual}; "
                    f"read it from the environment ({'RANK' if key == 'rank' else 'WORLD_SIZE'})"
                )
        return None

    saved = dist.init_process_group
    c10d.init_process_group = init_process_group
    dist.init_process_group = init_process_group
    try:
        yield
    finally:
        c10d.init_process_group = original
        dist.init_process_group = saved


# -- deepspeed ------------------------------------------------------------------------------------------
def uses_deepspeed(path: Path) -> bool:
    """Whether the script (or a module beside it, one level) mentions deepspeed. A torchrun script that does
    not is spared importing it (seconds per worker); a script that reaches deepspeed only deeper than that
    still works, it only misses the hooks (deepspeed_hooks)."""
    return "deepspeed" in sys.modules or mentions(path, "deepspeed")


def accelerate_env(*, use_gpu: bool, precision: str, config_path: str | None, hf_trainer: bool) -> dict[str, str]:
    """What ``accelerate launch`` would set for an Accelerate script: on CPU workers ``--cpu`` (Accelerator()
    then sees a MULTI_CPU run over the existing gloo group instead of one process), on GPU workers
    ``--use_deepspeed`` with raytrain's DeepSpeed config file (Accelerate does not combine DeepSpeed with
    CPU). A Trainer script sets up Accelerate itself from its TrainingArguments: nothing for it."""
    if hf_trainer:
        return {}
    env = {"ACCELERATE_MIXED_PRECISION": {"bf16": "bf16", "fp16": "fp16"}.get(precision, "no")}
    if not use_gpu:
        env["ACCELERATE_USE_CPU"] = "true"
    elif config_path:
        env.update(ACCELERATE_USE_DEEPSPEED="true", ACCELERATE_DEEPSPEED_CONFIG_FILE=config_path)
    return env


@contextlib.contextmanager
def deepspeed_hooks(*, injected_config: str | None, log: Any, enabled: bool = True) -> Iterator[None]:
    """If enabled and deepspeed is installed: skip its shared-memory op on CPU workers (minutes of
    compiling, unused in training), fix an older DeepSpeed's engine (deepspeed_compat), and if the script passes its own ``config=`` to ``deepspeed.initialize``
    while its args carry the config raytrain injected, drop raytrain's (DeepSpeed would refuse two
    configs) and say so."""
    deepspeed = None
    if enabled:
        try:
            import deepspeed
        except ImportError:  # a torchrun script on workers without deepspeed
            pass
    if deepspeed is None:
        yield
        return
    from raytrain.runtime.worker.engine import _skip_shm_comm_on_cpu

    try:
        _skip_shm_comm_on_cpu(deepspeed)
    except Exception as exc:  # an accelerator deepspeed cannot set up: let the script meet it itself
        log(f"raytrain: could not configure deepspeed's accelerator ({type(exc).__name__}: {exc})")
    original = deepspeed.initialize
    try:
        signature = inspect.signature(original)
    except (TypeError, ValueError):
        signature = None

    @functools.wraps(original)
    def initialize(*args: Any, **kwargs: Any) -> Any:
        if injected_config and signature is not None:
            try:
                given = signature.bind_partial(*args, **kwargs).arguments
            except TypeError:
                given = {}
            script_args = given.get("args")
            own = given.get("config") if given.get("config") is not None else given.get("config_params")
            if own is not None and getattr(script_args, "deepspeed_config", None) == injected_config:
                script_args.deepspeed_config = None
                log(
                    "raytrain: the script passes its own config to deepspeed.initialize(); raytrain's DeepSpeed "
                    "config (its --zero/--precision/batch flags) is not applied"
                )
        result = original(*args, **kwargs)
        from raytrain.runtime.worker import deepspeed_compat, guard

        engine = result[0] if isinstance(result, tuple) and result else result
        deepspeed_compat.fix_engine(engine)  # an older DeepSpeed's known defects (a no-op on 0.19)
        guard.install(engine)
        return result

    deepspeed.initialize = initialize
    try:
        yield
    finally:
        deepspeed.initialize = original


# -- running --------------------------------------------------------------------------------------------
def _exit_message(name: str, code: Any, rank: int) -> str:
    if isinstance(code, int):
        return f"{name} exited with status {code} on rank {rank}"
    return f"{name} exited on rank {rank}: {code}"  # sys.exit("message"): Python exits 1 with it


def run_script(
    path: str | os.PathLike,
    args: list[str],
    *,
    launch: Launch,
    deepspeed_config: dict[str, Any] | None,
    chdir: bool = True,
    defaults: Mapping[str, str] | None = None,
    extra: contextlib.AbstractContextManager | None = None,
    accelerate: Mapping[str, Any] | None = None,
) -> None:
    """Run ``path`` as ``__main__`` in this process, as a launcher would start it on this rank. ``defaults``:
    options given to the script's parser when it defines them and the user did not (injected_args);
    ``extra``: a context (a Trainer script's hooks) entered around the run; ``accelerate``: accelerate_env's
    keywords but config_path (the environment ``accelerate launch`` gives, set for a script that mentions
    accelerate, unless the job's environment sets it)."""
    path = Path(path).resolve()
    args = list(args)

    def log(message: str) -> None:
        if launch.rank == 0:
            print(message, flush=True)

    os.environ.update(launcher_env(launch))
    if launch.rank != 0:
        os.environ.setdefault("TQDM_DISABLE", "1")  # one progress bar (rank 0's) in the job's log, not N
    tmp = tempfile.mkdtemp(prefix="raytrain-script-")
    saved_argv, saved_path, saved_cwd = sys.argv, list(sys.path), os.getcwd()
    try:
        config_path = None
        if deepspeed_config is not None:
            config_path = os.path.join(tmp, "ds_config.json")
            Path(config_path).write_text(json.dumps(deepspeed_config, indent=2, sort_keys=True))
            os.environ[ENV_CONFIG] = config_path
        if accelerate is not None and mentions(path, "accelerate"):
            for key, value in accelerate_env(**accelerate, config_path=config_path).items():
                os.environ.setdefault(key, value)
        user_config = find_config_arg(args) is not None
        if user_config and config_path:  # the CLI merged raytrain's flags into the user's config
            args = replace_config_args(args, config_path)
        delivered: set[str] = set()
        sys.argv = [str(path), *args]
        sys.path.insert(0, str(path.parent))
        if chdir:
            os.chdir(path.parent)
        injected = None if user_config else config_path
        with reuse_process_group(), deepspeed_hooks(
            injected_config=injected, log=log, enabled=uses_deepspeed(path)
        ), argparse_hook(
            config_path=injected, local_rank=launch.local_rank, delivered=delivered, defaults=defaults
        ), extra or contextlib.nullcontext():
            try:
                runpy.run_path(str(path), run_name="__main__")
            except SystemExit as exc:
                if exc.code not in (None, 0):
                    # raised inside the handler: the SystemExit stays in the traceback as its context
                    raise ScriptExit(_exit_message(path.name, exc.code, launch.rank))
        if injected and not delivered & {*CONFIG_FLAGS, HF_FLAG}:
            log(
                f"raytrain: {path.name} parsed no --deepspeed_config option, so raytrain's DeepSpeed config was not "
                f"passed to it (it is in ${ENV_CONFIG})"
            )
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
        if chdir:
            os.chdir(saved_cwd)
        shutil.rmtree(tmp, ignore_errors=True)


def _store_address() -> tuple[str | None, int | None]:
    """MASTER_ADDR/MASTER_PORT of the initialised default process group's TCPStore, if any."""
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None, None
        store = dist.distributed_c10d._get_default_store()
        while hasattr(store, "underlying_store"):
            store = store.underlying_store
        return getattr(store, "host", None), getattr(store, "port", None)
    except Exception:
        return None, None


def launch_from_ray() -> Launch:
    """This Ray Train worker's place; MASTER_ADDR/PORT as Ray Train set them for its process group."""
    import ray.train

    ctx = ray.train.get_context()
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not (addr and port):
        addr, port = _store_address()
    return Launch(
        rank=ctx.get_world_rank(),
        local_rank=ctx.get_local_rank(),
        world_size=ctx.get_world_size(),
        local_world_size=ctx.get_local_world_size(),
        node_rank=ctx.get_node_rank(),
        master_addr=addr,
        master_port=port,
    )


def run_on_worker(plan: Plan, restore_from: str | None = None) -> None:
    """Script mode's train_loop_per_worker body. ``restore_from``: the checkpoint to continue from (a Hugging
    Face Trainer script's; other scripts load their own)."""
    launch = launch_from_ray()
    extra, deepspeed_config = None, plan.deepspeed
    if plan.hf_trainer:
        from raytrain.runtime.checkpoint.hf_trainer import prepare_resume
        from raytrain.runtime.hf.trainer import trainer_hooks

        resume = None
        if restore_from:
            deepspeed_config = copy.deepcopy(deepspeed_config)
            resume = prepare_resume(
                restore_from, world_size=launch.world_size, local_rank=launch.local_rank, config=deepspeed_config,
                log=lambda message: print(message, flush=True) if launch.rank == 0 else None,
            )
        extra = trainer_hooks(
            rank=launch.rank, train_batch=plan.train_batch, gpu=plan.scaling.use_gpu, world_size=launch.world_size,
            resume=resume, checkpoints=True,
        )
    run_script(
        find_job_file(plan.job_module),
        list(plan.job_args),
        launch=launch,
        deepspeed_config=deepspeed_config,
        defaults=plan.script_defaults,
        extra=extra,
        accelerate={"use_gpu": plan.scaling.use_gpu, "precision": plan.precision, "hf_trainer": plan.hf_trainer},
    )
