"""A long run's log without its compute: N metrics reports as fast as they go, no engine.

    raytrain submit bench/jobs/report_only.py --workers 1 --storage /tmp/long-run -- 200000
    time raytrain jobs status JOB     # what reading a long run's events costs (docs/benchmarks.md, long_log.py)
"""


def train(ctx):
    n = int(ctx.args[0]) if ctx.args else 100000
    ctx.total_steps = n
    for step in range(1, n + 1):
        ctx.report({"step": step, "loss": 1.0 / step, "lr": 3e-4, "grad_norm": 0.5})
