"""Errors raytrain raises, each mapped to a CLI exit code.

Exit codes (the CLI contract): 0 success, 1 the job failed, 2 bad usage or an impossible configuration.
"""
from __future__ import annotations


class RaytrainError(Exception):
    """Base class. ``exit_code`` is what the CLI exits with."""

    exit_code = 1


class ConfigError(RaytrainError):
    """A configuration that cannot work. The message names the flag, the value and what would work."""

    exit_code = 2

    def __init__(self, message: str, *, flag: str | None = None):
        super().__init__(message)
        self.flag = flag


class ClusterError(RaytrainError):
    """The cluster cannot be reached or cannot run the request (capacity, auth)."""

    exit_code = 2


class UnsafePath(RaytrainError):
    """A folder raytrain would trust (shared /tmp) that another user could control."""

    exit_code = 2


class JobFailed(RaytrainError):
    """The submitted job ended FAILED or STOPPED."""

    exit_code = 1
