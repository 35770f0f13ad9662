"""Options -> validated Plan (pure)."""
from raytrain.config.options import Options, load_profile
from raytrain.config.plan import Plan, Scaling
from raytrain.config.resolve import resolve

__all__ = ["Options", "Plan", "Scaling", "load_profile", "resolve"]
