"""Checkpoints on storage, without torch or deepspeed: the marker format every rank writes (``marker``) and
what the control plane reads from it: completeness, a run's listing, the ``--resume`` point (``store``).
The worker side that writes and loads the DeepSpeed state is raytrain.runtime.checkpoint.files."""
