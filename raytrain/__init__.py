"""raytrain: distributed PyTorch training with DeepSpeed on Ray clusters."""

__version__ = "0.1.0"
