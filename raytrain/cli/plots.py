"""`jobs plot` and `jobs compare` pictures: loss, throughput and memory per worker (against the planner's
estimate) over steps. matplotlib (Agg, no display) is imported only when a picture is drawn."""
from __future__ import annotations

from pathlib import Path

from raytrain.errors import ConfigError
from raytrain.run_metrics import MEMORY_PREFIX, RunMetrics

FORMATS = (".png", ".svg")
THROUGHPUT_KEYS = ("tokens_per_s", "samples_per_s")


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:
        raise ConfigError("plots need matplotlib: pip install 'raytrain[track]'", flag="-o") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def check_output(path: str) -> Path:
    out = Path(path)
    if out.suffix.lower() not in FORMATS:
        raise ConfigError(f"-o {path}: write a .png or .svg file", flag="-o")
    return out


def _throughput_key(runs: list[RunMetrics]) -> str | None:
    for key in THROUGHPUT_KEYS:
        if any(run.column(key)[0] for run in runs):
            return key
    return None


def _memory_axis(ax, run: RunMetrics, label_prefix: str = "", per_rank: bool = True, color=None) -> None:
    what = "GPU memory" if run.memory_source == "gpu" else "RSS"
    if per_rank:
        for rank in run.ranks:
            steps, values = run.column(f"{MEMORY_PREFIX}{rank}")
            if steps:
                ax.plot(steps, [v / 1e9 for v in values], marker=".", label=f"{label_prefix}rank {rank}")
    else:
        rows = [(r["step"], max(v for k, v in r.items() if k.startswith(MEMORY_PREFIX)))
                for r in run.steps if any(k.startswith(MEMORY_PREFIX) for k in r)]
        if rows:
            ax.plot([s for s, _ in rows], [v / 1e9 for _, v in rows], marker=".", color=color,
                    label=f"{label_prefix}max over ranks")
    if run.estimate and run.estimate.get("gpu_total"):
        gpu = run.memory_source == "gpu"  # a CPU worker has no CUDA context or allocator reserve
        value = run.estimate["gpu_total"] if gpu else (run.estimate.get("gpu_allocated") or run.estimate["gpu_total"])
        ax.axhline(value / 1e9, linestyle="--", color=color or "grey",
                   label=f"{label_prefix}planner estimate per {'GPU' if gpu else 'worker (training state)'}")
    ax.set_ylabel(f"peak {what} (GB)")


def _save(fig, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out


def plot_run(run: RunMetrics, output: str) -> Path:
    """One run: loss, throughput, and each worker's memory against the planner's estimate."""
    out = check_output(output)
    plt = _pyplot()
    fig, axes = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    steps, loss = run.column("loss")
    axes[0].plot(steps, loss, marker=".")
    axes[0].set_ylabel("loss")
    key = _throughput_key([run])
    if key:
        axes[1].plot(*run.column(key), marker=".")
    axes[1].set_ylabel((key or "samples_per_s").replace("_per_s", "/s"))
    _memory_axis(axes[2], run)
    axes[2].set_xlabel("step")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    title = run.job_id + (f" ({run.restarts} restart(s))" if run.restarts else "")
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    try:
        return _save(fig, out)
    finally:
        plt.close(fig)


def plot_compare(runs: list[RunMetrics], output: str) -> Path:
    """Several runs on the same axes: loss, throughput, and the largest worker's memory."""
    out = check_output(output)
    plt = _pyplot()
    fig, axes = plt.subplots(3, 1, figsize=(8, 9), sharex=True)
    key = _throughput_key(runs)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, run in enumerate(runs):
        color = colors[i % len(colors)]
        axes[0].plot(*run.column("loss"), marker=".", color=color, label=run.job_id)
        if key:
            axes[1].plot(*run.column(key), marker=".", color=color, label=run.job_id)
        _memory_axis(axes[2], run, label_prefix=f"{run.job_id}: ", per_rank=False, color=color)
    axes[0].set_ylabel("loss")
    axes[1].set_ylabel((key or "samples_per_s").replace("_per_s", "/s"))
    axes[2].set_xlabel("step")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="x-small")
    fig.tight_layout()
    try:
        return _save(fig, out)
    finally:
        plt.close(fig)
