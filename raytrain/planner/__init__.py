"""Memory planning: how much GPU and CPU memory a DeepSpeed configuration needs, and which one to run.

    memory.py  the arithmetic (ZeRO model states, offload, ZeRO-3 working set, activations, buffers)
    shape.py   a model's size from numbers (--params/--layers/--hidden/...)
    meta.py    a model's size from a job file's model(args), built on torch's meta device (imports torch)
    search.py  candidates, the speed ordering, and the fastest configuration that fits
    units.py   sizes and counts as users type them
    partition.py  the tensor-parallel split check (AutoTP partition spec, which layers it splits)

Nothing here imports torch or deepspeed at import time (meta.py and partition.py import torch inside their
functions).
"""
from raytrain.planner.memory import (
    Layout,
    Estimate,
    ModelStates,
    activation_memory,
    estimate,
    model_states,
    zero3_working_set,
)
from raytrain.planner.search import Candidate, Hardware, MemoryFit, make_hardware, plan, relative_time
from raytrain.planner.shape import ModelShape, shape_from_numbers

__all__ = [
    "Candidate", "Layout", "Estimate", "Hardware", "MemoryFit", "ModelShape", "ModelStates", "activation_memory",
    "estimate", "make_hardware", "model_states", "plan", "relative_time", "shape_from_numbers",
    "zero3_working_set",
]
