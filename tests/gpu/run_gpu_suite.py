#!/usr/bin/env python3
"""raytrain itself on one GPU, end to end, in one command (under 8 minutes on one GPU); a JSON summary.

    python tests/gpu/run_gpu_suite.py --out gpu-suite.json          # a machine with one CUDA GPU
    python tests/gpu/run_gpu_suite.py --dry-run --out dry.json      # CPU: every step and check but CUDA's

Steps (each a check in the summary, ``ok`` true/false with its figures):

1. ``cuda``: torch sees a CUDA GPU (dry run: says it is skipped);
2. ``cluster``: a private local cluster on free ports (``raytrain cluster up``, which counts the GPUs);
3. ``gpus``: ``raytrain gpus --json``: NVML's real inventory (one GPU, name, memory) (dry run: no GPU);
4. ``gpt_bf16``: ``raytrain submit`` of the example GPT (jobs/gpt_zero.py), 1 worker, ZeRO-2, bf16, a
   checkpoint every 5 steps: succeeded, what the engine built (ZeRO stage, precision), checkpoints 5 and 10;
5. ``memory``: ``jobs status --json`` of that run: the worker's memory from NVML (source gpu, device and
   own-process peaks; dry run: RSS), and the text status's per-worker line;
6. ``planner``: the planner's estimate (the ``estimate`` event) against ``torch.cuda.max_memory_allocated``
   of that run (the worker's final ``memory`` event): model states must fit under the measured peak, and
   the ratio is reported (dry run: no CUDA allocator, estimate only);
7. ``resume``: ``--resume`` of that run continues at step 11 from its step-10 checkpoint;
8. ``gpt_fp16``: the same with fp16: DeepSpeed's dynamic loss scale reaches the metrics (``loss_scale``)
   (dry run: skipped, DeepSpeed refuses fp16 on CPU);
9. ``mfu``: bench/gpu_mfu.py's model (GPT-2-medium shape; dry run ``--tiny``) run bare (no Ray, eager bf16)
   and through ``raytrain submit``; raytrain's tokens/s (hence MFU: same model, same FLOPs) over the bare
   run's, goal >= 0.98 (a goal, reported in ``goals``; dry run: no goal on CPU);
10. ``flight_recorder``: a 1-GPU job (tests/gpu/jobs/flight_recorder.py) sees PyTorch's NCCL flight recorder
   on (``TORCH_NCCL_TRACE_BUFFER_SIZE=2000``, ``TORCH_NCCL_DUMP_ON_TIMEOUT=1``, the dump prefix inside the run's
   record, its folder made) and the recorder holds the job's all-reduces (dry run: CPU workers get none of the
   variables).

``--use-running-cluster``: use the cluster of the environment's RAYTRAIN_HOME (started if needed) instead of a
private one, and leave it running (the CPU test of the dry run shares the e2e suite's cluster).
Exit 0 when every check passed (goals apart), 1 otherwise, 2 when there is no CUDA GPU without --dry-run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # this checkout's raytrain (its events), not another install's
    sys.path.insert(0, str(ROOT))
GOAL_MFU_RATIO = 0.98
GPT_GPU_ARGS = ["--vocab", "8192", "--dim", "512", "--layers", "8", "--heads", "8", "--seq", "256"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Suite:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.dry = a.dry_run
        self.t0 = time.monotonic()
        self.checks: list[dict] = []
        self.goals: list[dict] = []
        self.figures: dict = {}
        self.made: list[Path] = []
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
        env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        if not a.use_running_cluster:
            home = Path(tempfile.mkdtemp(prefix="raytrain-gpu-suite-"))
            temp = Path(tempfile.mkdtemp(prefix="rt-gs-", dir="/tmp"))  # short: Ray's socket paths
            self.made += [home, temp]
            env.update(RAYTRAIN_HOME=str(home), RAYTRAIN_RAY_TEMP_DIR=str(temp), RAYTRAIN_PORT=str(free_port()),
                       RAYTRAIN_DASHBOARD_PORT=str(free_port()))
            env.pop("RAYTRAIN_ADDRESS", None)
            env.pop("RAY_ADDRESS", None)
            if os.environ.get("RAYTRAIN_TEST_RECORDS"):  # .ci/run stops it if this is killed
                with open(os.environ["RAYTRAIN_TEST_RECORDS"], "a") as f:
                    f.write(json.dumps({"what": "gpu-suite", "home": str(home), "temp_dir": str(temp),
                                        "port": int(env["RAYTRAIN_PORT"]),
                                        "dashboard_port": int(env["RAYTRAIN_DASHBOARD_PORT"])}) + "\n")
        self.env = env
        self.work = Path(tempfile.mkdtemp(prefix="raytrain-gpu-suite-work-"))
        self.made.append(self.work)

    # -- plumbing ---------------------------------------------------------------------------------------
    def cli(self, *args, timeout: float = 420) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "raytrain.cli.main", *map(str, args)], env=self.env,
                              capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def cli_json(self, *args, timeout: float = 420) -> dict | list:
        proc = self.cli(*args, "--json", timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"raytrain {' '.join(map(str, args))} exited {proc.returncode}: "
                               f"{(proc.stderr or proc.stdout)[-1500:]}")
        return json.loads(proc.stdout)

    def facts(self, job: str):
        from raytrain.events import JobFacts

        return JobFacts.from_lines(self.cli("jobs", "logs", job, "-v").stdout.splitlines())

    def check(self, name: str, ok: bool, **detail) -> bool:
        entry = {"name": name, "ok": bool(ok), "at_s": round(time.monotonic() - self.t0, 1), **detail}
        self.checks.append(entry)
        print(f"gpu-suite: {'ok  ' if ok else 'FAIL'} {name} {json.dumps(detail, default=str)[:600]}", flush=True)
        return bool(ok)

    def skip(self, name: str, reason: str) -> None:
        self.checks.append({"name": name, "ok": True, "skipped": reason})
        print(f"gpu-suite: skip {name}: {reason}", flush=True)

    def step(self, name: str, fn) -> None:
        """Run one step; an exception is that step's failed check, and the suite goes on."""
        try:
            fn()
        except Exception as exc:  # a step's failure is reported in the summary; the next steps still run
            self.check(name, False, error=f"{type(exc).__name__}: {exc}"[:2000])

    def submit(self, job: Path, flags: list[str], args: list[str], timeout: float = 420) -> dict:
        proc = self.cli("submit", job, *flags, "--json", "--", *args, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"raytrain submit {job.name} exited {proc.returncode}: {(proc.stderr or proc.stdout)[-2000:]}")
        return json.loads(proc.stdout)

    # -- steps ------------------------------------------------------------------------------------------
    def cuda(self) -> None:
        import torch

        if self.dry:
            self.skip("cuda", f"dry run (torch {torch.__version__}, CUDA available: {torch.cuda.is_available()})")
            return
        name = torch.cuda.get_device_name(0)
        self.figures["device"] = name
        self.check("cuda", torch.cuda.device_count() >= 1, device=name, torch=torch.__version__,
                   cuda=torch.version.cuda)

    def cluster(self) -> None:
        if self.a.use_running_cluster:
            status = self.cli_json("cluster", "status")
            if not status.get("running"):
                up = self.cli("cluster", "up", timeout=300)
                if up.returncode != 0:
                    raise RuntimeError(up.stderr[-1500:])
                status = self.cli_json("cluster", "status")
        else:
            up = self.cli("cluster", "up", *(["--num-cpus", "2"] if self.dry else []), timeout=300)
            if up.returncode != 0:
                raise RuntimeError(f"cluster up exited {up.returncode}: {up.stderr[-1500:]}")
            status = self.cli_json("cluster", "status")
        totals = status.get("totals") or {}
        gpus = totals.get("gpus") or 0
        self.check("cluster", status.get("running") and (self.dry or gpus >= 1), cpus=totals.get("cpus"), gpus=gpus)

    def gpus(self) -> None:
        data = self.cli_json("gpus")
        nodes = data["nodes"]
        found = [g for n in nodes for g in n["gpus"]]
        if self.dry:
            self.check("gpus", len(nodes) >= 1 and found == [], nodes=len(nodes), gpus=found)
            return
        g = found[0] if found else {}
        self.figures["gpu"] = g
        self.check("gpus", len(found) >= 1 and bool(g.get("name")) and (g.get("memory_total") or 0) > 0,
                   gpus=len(found), name=g.get("name"), memory_total=g.get("memory_total"),
                   compute_capability=g.get("compute_capability"), driver=g.get("driver_version"))

    def _gpt_job(self) -> Path:
        folder = self.work / "gpt"
        if not folder.exists():
            folder.mkdir()
            for name in ("gpt_zero.py", "example_utils.py"):
                shutil.copy(ROOT / "jobs" / name, folder / name)
        return folder / "gpt_zero.py"

    def _gpt_flags(self, precision: str) -> list[str]:
        flags = ["--workers", "1", "--zero", "2", "--precision", precision, "--micro-batch", "4",
                 "--checkpoint-every", "5"]
        return flags + ([] if self.dry else ["--gpus-per-worker", "1"])

    def _gpt_args(self, steps: int) -> list[str]:
        return ["--steps", str(steps)] + ([] if self.dry else GPT_GPU_ARGS)

    def gpt_bf16(self) -> None:
        info = self.submit(self._gpt_job(), self._gpt_flags("bf16"), self._gpt_args(10))
        self.gpt_run = info["id"]
        facts = self.facts(info["id"])
        engine = facts.engine or {}
        steps = [m["step"] for m in facts.metrics]
        self.check("gpt_bf16", info["state"] == "succeeded" and steps == list(range(1, 11))
                   and facts.checkpoints == [5, 10] and engine.get("zero_stage") == 2
                   and engine.get("precision") == "bf16" and engine.get("micro_batch") == 4,
                   job=info["id"], state=info["state"], steps=len(steps), checkpoints=facts.checkpoints,
                   engine={k: engine.get(k) for k in ("zero_stage", "precision", "micro_batch", "grad_accum", "dp")},
                   final_loss=facts.losses[-1] if facts.losses else None,
                   samples_per_s=facts.metrics[-1].get("samples_per_s") if facts.metrics else None)

    def memory(self) -> None:
        info = self.cli_json("jobs", "status", self.gpt_run)
        m = (info.get("memory") or {}).get("0") or {}
        text = self.cli("jobs", "status", self.gpt_run).stdout
        if self.dry:
            self.check("memory", m.get("source") == "cpu" and (m.get("rss_peak") or 0) > 0, memory=m)
            return
        self.figures["worker_memory"] = m
        self.check("memory", m.get("source") == "gpu" and (m.get("gpu_memory_peak") or 0) > 0
                   and (m.get("gpu_process_memory_peak") or 0) > 0 and "GPU" in text,
                   memory=m, status_lines=[l for l in text.splitlines() if "memory" in l.lower()][:4])

    def planner(self) -> None:
        facts = self.facts(self.gpt_run)
        est = facts.estimate or {}
        measured = ((facts.memory or {}).get(0) or {}).get("torch_max_allocated")
        if self.dry:
            self.check("planner", (est.get("gpu_allocated") or 0) > 0 and measured is None,
                       estimate=est.get("gpu_allocated"), note="dry run: no CUDA allocator to compare with")
            return
        ratio = est["gpu_allocated"] / measured if measured else None
        self.figures["planner"] = {"estimate_gpu_allocated": est.get("gpu_allocated"),
                                   "estimate_model_states": est.get("model_states"),
                                   "torch_max_allocated": measured, "estimate_over_measured": ratio}
        # the estimate of model states (weights, gradients, optimizer) cannot exceed what the run allocated
        self.check("planner", bool(measured) and est.get("model_states", 0) <= measured, **self.figures["planner"])

    def resume(self) -> None:
        info = self.submit(self._gpt_job(), [*self._gpt_flags("bf16"), "--resume", self.gpt_run], self._gpt_args(14))
        facts = self.facts(info["id"])
        steps = [m["step"] for m in facts.metrics]
        self.check("resume", info["state"] == "succeeded" and steps == [11, 12, 13, 14]
                   and bool((facts.started or {}).get("resume_from")),
                   job=info["id"], steps=steps, resume_from=(facts.started or {}).get("resume_from"))

    def gpt_fp16(self) -> None:
        if self.dry:
            self.skip("gpt_fp16", "dry run: DeepSpeed refuses fp16 on CPU")
            return
        info = self.submit(self._gpt_job(), self._gpt_flags("fp16"), self._gpt_args(10))
        facts = self.facts(info["id"])
        scales = [m.get("loss_scale") for m in facts.metrics]
        self.check("gpt_fp16", info["state"] == "succeeded" and (facts.engine or {}).get("precision") == "fp16"
                   and all(isinstance(s, (int, float)) and s > 0 for s in scales) and len(scales) == 10,
                   job=info["id"], loss_scale=scales[-1:] , skipped_steps=facts.metrics[-1].get("skipped_steps"))

    def mfu(self) -> None:
        steps, warmup = (4, 1) if self.dry else (30, 5)
        bare_out = self.work / "bare.json"
        bare_cmd = [sys.executable, str(ROOT / "bench" / "gpu_mfu.py"), "--compile", "off", "--fp16-steps", "0",
                    "--steps", str(steps), "--warmup", str(warmup), "--out", str(bare_out)]
        bare_cmd += ["--device", "cpu", "--tiny"] if self.dry else []
        proc = subprocess.run(bare_cmd, env=self.env, capture_output=True, text=True, timeout=420, cwd=ROOT)
        if proc.returncode != 0:
            raise RuntimeError(f"bare gpu_mfu.py exited {proc.returncode}: {proc.stderr[-1500:]}")
        bare = json.loads(bare_out.read_text())["results"][0]
        from importlib import util

        spec = util.spec_from_file_location("gpu_mfu_shapes", ROOT / "bench" / "gpu_mfu.py")
        gm = util.module_from_spec(spec)
        spec.loader.exec_module(gm)
        shape = gm.SHAPES["tiny" if self.dry else "350m"]
        flags = ["--workers", "1", "--zero", "2", "--precision", "bf16", "--micro-batch", str(shape["micro_batch"])]
        flags += [] if self.dry else ["--gpus-per-worker", "1"]
        job_dir = self.work / "mfu"
        job_dir.mkdir(exist_ok=True)
        shutil.copy(ROOT / "bench" / "gpu_mfu.py", job_dir / "gpu_mfu.py")
        info = self.submit(job_dir / "gpu_mfu.py", flags, ["--steps", str(steps + warmup)] + (["--tiny"] if self.dry else []))
        facts = self.facts(info["id"])
        rates = [m["samples_per_s"] for m in facts.metrics[warmup:] if m.get("samples_per_s")]
        ray_tokens = statistics.median(rates) * shape["seq"] if rates else None
        ratio = ray_tokens / bare["tokens_per_s"] if ray_tokens and bare.get("tokens_per_s") else None
        ray_mfu = bare["mfu"] * ratio if bare.get("mfu") and ratio else None
        self.figures["mfu"] = {"bare_tokens_per_s": bare.get("tokens_per_s"), "bare_mfu": bare.get("mfu"),
                               "raytrain_tokens_per_s": ray_tokens, "raytrain_mfu": ray_mfu,
                               "raytrain_over_bare": ratio, "goal": GOAL_MFU_RATIO, "job": info["id"]}
        self.check("mfu", info["state"] == "succeeded" and ratio is not None and ratio > 0, **self.figures["mfu"])
        if not self.dry and ratio is not None:
            self.goals.append({"name": "mfu_ratio", "goal": GOAL_MFU_RATIO, "value": ratio, "met": ratio >= GOAL_MFU_RATIO})

    def flight_recorder(self) -> None:
        job_dir = self.work / "flight_recorder"
        job_dir.mkdir(exist_ok=True)
        shutil.copy(ROOT / "tests" / "gpu" / "jobs" / "flight_recorder.py", job_dir / "flight_recorder.py")
        flags = ["--workers", "1", "--zero", "0"] + ([] if self.dry else ["--gpus-per-worker", "1"])
        out = job_dir / "seen"
        out.mkdir(exist_ok=True)
        info = self.submit(job_dir / "flight_recorder.py", flags, ["--out", str(out)])
        seen = [json.loads(f.read_text()) for f in sorted(out.glob("rank-*.json"))]
        rank = seen[0] if seen else {}
        env = rank.get("env") or {}
        if self.dry:
            self.check("flight_recorder", info["state"] == "succeeded" and bool(seen)
                       and not any(env.values()), env=env, state=info["state"], ranks_seen=len(seen),
                       note="dry run: CPU workers get no NCCL recorder")
            return
        self.check("flight_recorder", info["state"] == "succeeded" and rank.get("backend") == "nccl"
                   and env.get("TORCH_NCCL_TRACE_BUFFER_SIZE") == "2000" and env.get("TORCH_NCCL_DUMP_ON_TIMEOUT") == "1"
                   and "/raytrain/nccl/rank-" in (env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") or "")
                   and rank.get("dump_folder_exists") and (rank.get("entries") or 0) >= 5,
                   job=info["id"], **rank)

    # -- the run ----------------------------------------------------------------------------------------
    def run(self) -> int:
        import torch

        if not self.dry and not torch.cuda.is_available():
            print("gpu-suite: no CUDA GPU (torch.cuda.is_available() is False): run with --dry-run on CPU",
                  file=sys.stderr)
            return 2
        try:
            for name in ("cuda", "cluster", "gpus", "gpt_bf16", "memory", "planner", "resume", "gpt_fp16", "mfu",
                         "flight_recorder"):
                if name in ("memory", "planner", "resume") and not hasattr(self, "gpt_run"):
                    self.check(name, False, error="no gpt_bf16 run to read")
                    continue
                self.step(name, getattr(self, name))
        finally:
            if not self.a.use_running_cluster:
                self.cli("cluster", "down", "--force", timeout=180)
            for path in self.made:
                shutil.rmtree(path, ignore_errors=True)
        ok = all(c["ok"] for c in self.checks)
        summary = {"ok": ok, "dry_run": self.dry, "elapsed_s": round(time.monotonic() - self.t0, 1),
                   "checks": self.checks, "goals": self.goals, "figures": self.figures}
        Path(self.a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(self.a.out).write_text(json.dumps(summary, indent=2, default=str))
        print(f"gpu-suite: {'all checks passed' if ok else 'FAILED'} in {summary['elapsed_s']} s; summary in {self.a.out}",
              flush=True)
        return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dry-run", action="store_true", help="on CPU: every step and check but CUDA's")
    p.add_argument("--out", default="gpu-suite.json", help="the JSON summary (default %(default)s)")
    p.add_argument("--use-running-cluster", action="store_true",
                   help="use (and leave running) the cluster of the environment's RAYTRAIN_HOME")
    a = p.parse_args(argv)
    return Suite(a).run()


if __name__ == "__main__":
    sys.exit(main())
