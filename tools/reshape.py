"""The mechanical part of issue 42's reshaping: split ``raytrain/runtime/`` into subpackages by who runs the code
and what it serves, and give modules and classes names that mean one thing. Renames only (``git mv`` and
rewritten references); behaviour is unchanged.

    python tools/reshape.py            # apply, from the repository root (a clean tree is best)
    python tools/reshape.py --dry-run  # say what it would do, change nothing

Idempotent: a move already made is skipped, and every rewrite matches only the old spelling, so a second run
changes nothing. A module of ``raytrain/runtime/`` the script does not know is left in place with a warning;
so are the modules the Ray tunings package takes (``SKIP``). References are rewritten in every file git
tracks (Python, Markdown, YAML, shell, TOML): imports (``from raytrain.runtime import worker`` becomes
``from raytrain.runtime.worker import loop as worker``: the local name stays), dotted names in strings
(``python -m raytrain.runtime.driver``, ``monkeypatch.setattr("raytrain.runtime.x.y", ...)``) and paths
(``raytrain/runtime/driver.py``). Then ``docs/settings.md`` is regenerated and the code map (ARCHITECTURE.md's
section, docs/code-map.md) written.
"""
from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# raytrain.runtime's subpackages: what each holds, and old module -> new module inside it.
SUBPACKAGES = {
    "driver": ("The job's Ray drivers, on the head: the training driver (entrypoint: phases capacity, storage, "
               "resume, data, fit, outcome), the checks and watches it runs, and the utilities the CLI runs as "
               "Ray jobs (gpus, placement_watch, hang_watch).", {
                   "driver": "entrypoint",
                   "preflight": "preflight",
                   "placement_watch": "placement_watch",
                   "hang_watch": "hang_watch",
                   "process_exit": "process_exit",
                   "gpus": "gpus",
                   "torch_backend": "trainer",
               }),
    "worker": ("What every Ray Train worker runs: the train loop, ``ctx`` and its collaborators (engine, reports, "
               "guard, heartbeats, elastic resize, parallel layouts), script mode, rank logs.", {
                   "worker": "loop",
                   "engine": "engine",
                   "context": "context",
                   "parallel": "parallel",
                   "guard": "guard",
                   "heartbeat": "heartbeat",
                   "reporter": "reporter",
                   "throughput": "throughput",
                   "monitor": "memory_monitor",
                   "core_binding": "core_binding",
                   "rank_log": "rank_log",
                   "rank_log_copy": "rank_log_copy",
                   "worker_errors": "errors",
                   "script": "script",
                   "job_file": "job_import",
                   "resize": "resize",
                   "memory_estimate": "memory_estimate",
                   "imports": "deepspeed_imports",
                   "collective_time": "collective_time",
                   "early_imports": "early_imports",
                   "preemption": "preemption",
                   "rollback": "rollback",
               }),
    "datasets": ("``--data``: the driver reads and preprocesses each dataset (source), a feeder streams it (feed), "
             "each rank iterates its share (batches: ``ctx.dataset``).", {
                 "data": "batches",
                 "data_feed": "feed",
                 "data_source": "source",
             }),
    "checkpoint": ("Checkpoints on a worker: DeepSpeed's files with the data position (files), one run's "
                   "resume/restore/save schedule (lifecycle), a Hugging Face Trainer's checkpoints (hf_trainer). "
                   "Not activation checkpointing (``ctx.activation_checkpointed``).", {
                       "checkpoint": "files",
                       "checkpointer": "lifecycle",
                       "hf_checkpoints": "hf_trainer",
                       "async_checkpoint": "async_save",
                   }),
    "hf": ("Hugging Face on a worker: models in ``train(ctx)`` jobs, a Trainer script's progress, rebuilding a "
           "model from its description.", {
               "hf_model": "model",
               "hf_trainer": "trainer",
               "hf_rebuild": "rebuild",
           }),
    "tracking": ("``--track``: TensorBoard, MLflow and W&B runs logged from rank 0.", {
        "trackers": "trackers",
    }),
    "export": ("``raytrain export``, in a process of its own: a checkpoint consolidated (consolidate) into a "
               "state_dict (entry) or a Hugging Face folder (hf, hf_trainer).", {
                   "export": "entry",
                   "export_hf": "hf",
                   "export_trainer": "hf_trainer",
                   "consolidate": "consolidate",
               }),
}
SHORT = {  # the code map's cells
    "driver": "the head: the training driver's phases, its checks and watches, the CLI's Ray utilities",
    "worker": "every Ray Train worker: the train loop, `ctx` and its collaborators, script mode, rank logs",
    "datasets": "`--data`: read and preprocess (driver), feed, each rank's batches",
    "checkpoint": "a worker's checkpoints: files, one run's schedule, a Trainer's",
    "hf": "Hugging Face models and Trainer scripts on a worker",
    "tracking": "`--track` runs, from rank 0",
    "export": "`raytrain export`, in a process of its own",
}
# Moved by the Ray tunings package (raytrain/ray_tuning/): never touched here.
SKIP = {"prestart", "prompt_poll"}  # raytrain.ray_tuning's now

# Other modules: old dotted name -> new dotted name (same package).
MODULES = {
    "raytrain.targets.kuberay": "raytrain.targets.kuberay_rayjob",
    "raytrain.targets.k8s_portforward": "raytrain.targets.kuberay_portforward",
    "raytrain.targets.ray_jobs": "raytrain.targets.ray_jobs_api",
    "raytrain.config.jobfile": "raytrain.config.job_check",
    "raytrain.config.profile": "raytrain.config.config_file",
    "raytrain.config.profile_types": "raytrain.config.config_file_types",
    "raytrain.cli.plan": "raytrain.cli.memory_plan",
}
# Classes renamed everywhere (whole words).
CLASSES = {
    "RayJobTarget": "KubeRayJobTarget",  # a KubeRay RayJob
    "RayJobsTarget": "RayJobsApiTarget",  # any Ray Jobs API (--address)
    "RayClusterJobsTarget": "KubeRayPortForwardTarget",  # a RayCluster's Jobs API through a port-forward
    "LocalCluster": "LocalHeadRecord",  # the record of a running local head (LocalRayCluster is the Cluster)
}
# planner.memory's ``Config`` (a DeepSpeed layout: zero, offload, tp, pp, precision, checkpointing): renamed
# only where it is the planner's (in raytrain/planner/ and in files that import it from there).
PLANNER_CONFIG = ("Config", "Layout")

TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt", ".cfg", ".ini", ""}
SELF = {"tools/reshape.py", "tests/unit/test_reshape.py", "docs/code-map.md"}  # their old names are meant
MAP_START, MAP_END = "<!-- code map: written by tools/reshape.py -->", "<!-- /code map -->"


def warn(msg: str) -> None:
    print(f"reshape: warning: {msg}", file=sys.stderr)


def git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"reshape: git {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def runtime_moves() -> dict[str, str]:
    """Old dotted module -> new, for raytrain.runtime."""
    return {f"raytrain.runtime.{old}": f"raytrain.runtime.{sub}.{new}"
            for sub, (_, mods) in SUBPACKAGES.items() for old, new in mods.items()}


def path_of(dotted: str) -> Path:
    return ROOT / (dotted.replace(".", "/") + ".py")


def top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def check_no_ambiguity() -> None:
    """A subpackage named like an old module (driver, worker, checkpoint, export): a reference
    ``raytrain.runtime.worker.X`` is new when X is one of worker/'s modules, else old. So no old module may have a
    top-level name that is one of its subpackage's new modules."""
    for sub, (_, mods) in SUBPACKAGES.items():
        old = ROOT / "raytrain" / "runtime" / f"{sub}.py"
        if old.is_file():
            clash = top_level_names(old) & set(mods.values())
            if clash:
                sys.exit(f"reshape: raytrain/runtime/{sub}.py defines {sorted(clash)}, which are also module "
                         f"names in raytrain/runtime/{sub}/: rename one before running this script")


def move(old: str, new: str, dry: bool) -> bool:
    """git mv one module; True when the move is made (now or before)."""
    src, dst = path_of(old), path_of(new)
    if dst.exists() and not src.exists():
        return True
    if not src.exists():
        warn(f"{src.relative_to(ROOT)} is not there (moved by another change?): left alone")
        return False
    if dst.exists():
        warn(f"both {src.relative_to(ROOT)} and {dst.relative_to(ROOT)} exist: left alone")
        return False
    print(f"git mv {src.relative_to(ROOT)} {dst.relative_to(ROOT)}")
    if not dry:
        git("mv", str(src.relative_to(ROOT)), str(dst.relative_to(ROOT)))
    return True


def make_subpackage(sub: str, doc: str, dry: bool) -> None:
    init = ROOT / "raytrain" / "runtime" / sub / "__init__.py"
    if init.exists() or dry:
        return
    init.parent.mkdir(exist_ok=True)
    init.write_text(f'"""{doc}"""\n')
    git("add", "-f", str(init.relative_to(ROOT)))


# -- rewriting references --------------------------------------------------------------------------------
FROM_IMPORT = re.compile(
    r"^(?P<indent>[ \t]*)from (?P<pkg>raytrain(?:\.[a-z_]+)*) import (?P<names>\([^)]*\)|[^\n#]*?)"
    r"(?P<comment>[ \t]*#[^\n]*)?$", re.M)


# the same inside a one-line code string: "...; from raytrain.runtime import rank_log; ..." (python -c scripts)
EMBEDDED_IMPORT = re.compile(
    r"(?<=[\"';])(?P<indent> ?)from (?P<pkg>raytrain(?:\.[a-z_]+)*) import (?P<names>[\w ,]+?)(?P<comment>)"
    r"(?=\\n|;|[\"']|$)", re.M)


def parse_names(text: str) -> list[tuple[str, str | None]]:
    out = []
    for part in text.strip().strip("()").replace("\n", " ").split(","):
        words = part.split()
        if words:
            out.append((words[0], words[2] if len(words) == 3 and words[1] == "as" else None))
    return out


class Rewriter:
    def __init__(self, moves: dict[str, str]):
        self.moves = moves  # old dotted -> new dotted, the moves made
        # a new package with the name of an old module: references followed by one of its modules are new
        self.new_children: dict[str, set[str]] = {}
        for new in moves.values():
            pkg, _, mod = new.rpartition(".")
            self.new_children.setdefault(pkg, set()).add(mod)
        self.dotted = []
        for old, new in sorted(moves.items(), key=lambda kv: -len(kv[0])):
            guard = self._guard(old)
            self.dotted.append((re.compile(rf"(?<![\w.]){re.escape(old)}(?![\w]){guard}"), new))
            if old.startswith("raytrain.runtime."):  # "runtime.worker_errors" in prose and comments
                short_old, short_new = old.removeprefix("raytrain."), new.removeprefix("raytrain.")
                self.dotted.append((re.compile(rf"(?<![\w./]){re.escape(short_old)}(?![\w]){guard}"), short_new))
            old_path, new_path = old.replace(".", "/")[len("raytrain/"):], new.replace(".", "/")[len("raytrain/"):]
            self.dotted.append((re.compile(rf"(?<![\w.]){re.escape(old_path)}\.py\b"), new_path + ".py"))

    def _guard(self, old: str) -> str:
        children = self.new_children.get(old)
        if not children:
            return ""
        return rf"(?!\.(?:{'|'.join(sorted(children))})\b)(?! import (?:{'|'.join(sorted(children))})\b)"

    def from_import(self, m: re.Match, joiner: str = "\n") -> str:
        indent, pkg, names, comment = m["indent"], m["pkg"], m["names"], m["comment"] or ""
        parsed = parse_names(names)
        if not parsed or any(not re.fullmatch(r"[\w*]+", n) for n, _ in parsed):
            return m.group(0)
        # "from raytrain.runtime.data import feed, source": already new (a new package's modules)
        if pkg in self.new_children and all(n in self.new_children[pkg] for n, _ in parsed):
            return m.group(0)
        if pkg in self.moves:  # from raytrain.runtime.driver import main -> from raytrain.runtime.driver.entrypoint
            return f"{indent}from {self.moves[pkg]} import {names}{comment}"
        groups: dict[str, list[str]] = {}
        changed = False
        for name, alias in parsed:
            old = f"{pkg}.{name}"
            if old in self.moves:
                changed = True
                new_pkg, _, new_name = self.moves[old].rpartition(".")
                local = alias or name
                groups.setdefault(new_pkg, []).append(new_name if new_name == local else f"{new_name} as {local}")
            else:
                groups.setdefault(pkg, []).append(f"{name} as {alias}" if alias else name)
        if not changed:
            return m.group(0)
        lines = [f"from {p} import {', '.join(ns)}" for p, ns in groups.items()]
        lines[0] += comment
        return indent + (joiner + ("" if joiner == "; " else indent)).join(lines)

    def text(self, text: str) -> str:
        text = FROM_IMPORT.sub(self.from_import, text)
        text = EMBEDDED_IMPORT.sub(lambda m: self.from_import(m, "; "), text)
        for pattern, new in self.dotted:
            text = pattern.sub(new, text)
        return text


def rename_classes(path: str, text: str) -> str:
    for old, new in CLASSES.items():
        text = re.sub(rf"\b{old}\b", new, text)
    old, new = PLANNER_CONFIG
    planner_file = path.startswith("raytrain/planner/")
    imports_it = any(old in [n for n, _ in parse_names(m["names"])]
                     for m in FROM_IMPORT.finditer(text) if m["pkg"] in ("raytrain.planner", "raytrain.planner.memory"))
    if planner_file or imports_it:
        text = re.sub(rf"\b{old}\b", new, text)
    text = re.sub(rf"\b(planner|memory)\.{old}\b", rf"\1.{new}", text) if "raytrain.planner" in text else text
    return text


def tracked_text_files() -> list[str]:
    out = []
    for name in git("ls-files").splitlines():
        p = ROOT / name
        if name in SELF or not p.is_file() or p.suffix not in TEXT_SUFFIXES:
            continue
        if p.suffix == "" and not (name.startswith(".ci/") or name.startswith("scripts/")):
            continue
        out.append(name)
    return out


# -- the code map ----------------------------------------------------------------------------------------
def code_map_section(moves: dict[str, str]) -> str:
    rows = ["| runtime subpackage | who runs it, what it serves | modules |", "| --- | --- | --- |"]
    for sub, (doc, mods) in SUBPACKAGES.items():
        made = [new for old, new in mods.items() if f"raytrain.runtime.{old}" in moves]
        if made:
            rows.append(f"| `runtime/{sub}/` | {SHORT[sub]} | {', '.join(made)} |")
    return "\n".join([MAP_START, "## Code map", "",
                      "Where the code lives; [docs/code-map.md](docs/code-map.md) lists each module's old name.", "",
                      *rows, MAP_END])


def code_map_page(moves: dict[str, str]) -> str:
    lines = ["# Code map: old names and new", "",
             "What issue 42's reshaping (`tools/reshape.py`) renamed. Behaviour is unchanged; CLI commands and",
             "flags keep their names (see [cli.md](cli.md)).", "",
             "## Modules", "", "| old | new |", "| --- | --- |"]
    lines += [f"| `{old}` | `{new}` |" for old, new in sorted(moves.items())]
    lines += ["", "## Classes", "", "| old | new | what it is |", "| --- | --- | --- |"]
    what = {"RayJobTarget": "submits a KubeRay RayJob", "RayJobsTarget": "submits through any Ray Jobs API",
            "RayClusterJobsTarget": "a RayCluster's Jobs API through a port-forward",
            "LocalCluster": "the record of a running local head (the `Cluster` is `LocalRayCluster`)"}
    lines += [f"| `{old}` | `{new}` | {what[old]} |" for old, new in CLASSES.items()]
    lines += [f"| `planner.memory.{PLANNER_CONFIG[0]}` | `planner.memory.{PLANNER_CONFIG[1]}` | "
              "a DeepSpeed layout the memory planner estimates |", ""]
    return "\n".join(lines)


def write_code_map(moves: dict[str, str], dry: bool) -> None:
    arch = ROOT / "ARCHITECTURE.md"
    text = arch.read_text()
    section = code_map_section(moves)
    if MAP_START in text:
        text = re.sub(re.escape(MAP_START) + r".*?" + re.escape(MAP_END), lambda _: section, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    page = ROOT / "docs" / "code-map.md"
    if not dry:
        arch.write_text(text)
        page.write_text(code_map_page(moves))
        git("add", "-f", "ARCHITECTURE.md", "docs/code-map.md")


LAYOUT_RUNTIME = """\
raytrain/runtime/   what runs on the cluster (the only code importing deepspeed; the control plane never imports
                    it): driver/ (the head: the training driver's phases, preflight, placement and hang watches,
                    the CLI's Ray utilities), worker/ (train loop, ctx and its collaborators, engine, guard,
                    heartbeats, script mode, rank logs), datasets/ (--data), checkpoint/ (a worker's checkpoints),
                    hf/, tracking/ (--track), export/ (raytrain export). docs/code-map.md: the old module names.
"""


def rewrite_layout_page(dry: bool) -> None:
    """docs/layout.md's paragraph on raytrain/runtime/ (prose no rename can fix) describes the subpackages."""
    page = ROOT / "docs" / "layout.md"
    if not page.is_file():
        return
    text = page.read_text()
    new = re.sub(r"^raytrain/runtime/ .*?(?=^raytrain/\w)", lambda _: LAYOUT_RUNTIME, text, count=1, flags=re.S | re.M)
    for bare, renamed in (("ray_jobs (", "ray_jobs_api ("), ("kuberay\n", "kuberay_rayjob\n"),
                          ("k8s_portforward (", "kuberay_portforward (")):  # the targets' line names modules bare
        new = re.sub(rf"(?<![\w/.]){re.escape(bare)}", renamed.replace("\\", r"\\"), new)
    if new == text and LAYOUT_RUNTIME not in text:
        warn("docs/layout.md: no paragraph on raytrain/runtime/ found: describe its subpackages there by hand")
    elif not dry:
        page.write_text(new)


def regenerate_settings(dry: bool) -> None:
    if dry or not (ROOT / "raytrain" / "settings.py").exists():
        return
    out = subprocess.run([sys.executable, "-m", "raytrain.settings"], cwd=ROOT, capture_output=True, text=True,
                         env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    if out.returncode == 0:
        (ROOT / "docs" / "settings.md").write_text(out.stdout)
    else:
        warn(f"docs/settings.md not regenerated: {out.stderr.strip().splitlines()[-1:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="say what would move; change nothing")
    dry = ap.parse_args().dry_run
    check_no_ambiguity()
    runtime = ROOT / "raytrain" / "runtime"
    known = {old for _, mods in SUBPACKAGES.values() for old in mods} | SKIP | {"__init__"}
    for path in sorted(runtime.glob("*.py")):
        if path.stem not in known:
            warn(f"raytrain/runtime/{path.name}: a module this script does not know: left in place")
    made: dict[str, str] = {}
    for sub, (doc, mods) in SUBPACKAGES.items():
        if any(path_of(f"raytrain.runtime.{old}").exists() for old in mods):
            make_subpackage(sub, doc, dry)
        for old, new in mods.items():
            o, n = f"raytrain.runtime.{old}", f"raytrain.runtime.{sub}.{new}"
            if move(o, n, dry):
                made[o] = n
    for old, new in MODULES.items():
        if move(old, new, dry):
            made[old] = new
    if dry:
        return 0
    rewriter = Rewriter(made)
    changed = []
    for name in tracked_text_files():
        path = ROOT / name
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        new = rename_classes(name, rewriter.text(text)) if path.suffix in (".py", ".md", "") else rewriter.text(text)
        if new != text:
            path.write_text(new)
            changed.append(name)
    regenerate_settings(dry)
    rewrite_layout_page(dry)
    write_code_map(made, dry)
    print(f"reshape: {len(made)} modules in place, references rewritten in {len(changed)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
