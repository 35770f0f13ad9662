"""The worker side. The only package that imports torch, Ray Train and deepspeed; never the CLI."""
