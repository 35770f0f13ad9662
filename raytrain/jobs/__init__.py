"""A job's lifecycle: explicit states read from the same facts by status, logs and follow."""
from raytrain.jobs.state import JobInfo, JobState, state_of

__all__ = ["JobInfo", "JobState", "state_of"]
