"""Options -> validated Plan (pure).

    options.py      every option declared once (flag, config-file key, help, default)
    profile.py      a --config profile (YAML/TOML/JSON) -> Options
    jobfile.py      the job file checked without importing it (train(ctx) or script mode)
    script_mode.py  script mode's rules and the DeepSpeed config in a script's arguments
    script_args.py  a script's command line (also used by the workers)
    deepspeed.py    --ds-config under the flags, and the exact DeepSpeed dict
    parallel.py     --tp/--pp, --tp-spec and the ZeRO-3/ZeRO++ keys
    elastic.py      --workers MIN-MAX (also used by the workers to rescale)
    batch.py        micro-batch x grad-accum x data-parallel = global batch
    resolve.py      the pipeline: Options -> Plan
    plan.py         the Plan that travels to the driver and the workers
"""
from raytrain.config.options import Options
from raytrain.config.plan import Plan, Scaling
from raytrain.config.config_file import load_profile
from raytrain.config.resolve import resolve

__all__ = ["Options", "Plan", "Scaling", "load_profile", "resolve"]
