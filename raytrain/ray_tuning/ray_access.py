"""Ray internals raytrain reads that are not tunings, each with a public-API fallback for a Ray that moved
them. The contract test (tests/unit/test_ray_tuning_contracts.py) checks each one still exists."""
from __future__ import annotations

import contextlib
import importlib.util
from typing import Any, Callable, Iterator

# where Ray Train logs a train function's error ("Error in training function:"); raytrain prints it itself
RAY_TRAIN_ERROR_LOGGER = "ray.train.v2._internal.util"
# Ray's job client loggers that log each upload and websocket close at INFO
NOISY_CLIENT_LOGGERS = ("ray.dashboard.modules.job.sdk", "ray.dashboard.modules.dashboard_sdk",
                        "ray._private.runtime_env.packaging")


def ray_train_error_logger() -> str | None:
    """The logger Ray Train logs a train function's error to; None where this Ray has no such module (its
    copy of the traceback then stays in the log)."""
    try:
        found = importlib.util.find_spec(RAY_TRAIN_ERROR_LOGGER) is not None
    except (ImportError, ValueError):
        found = False
    return RAY_TRAIN_ERROR_LOGGER if found else None


def ref_bundles(dataset: Any) -> Iterator[Any]:
    """``dataset``'s blocks as Ray Data executes them (``Dataset.iter_internal_ref_bundles``, a DeveloperAPI)."""
    method = getattr(dataset, "iter_internal_ref_bundles", None)
    if method is None:
        import ray

        raise RuntimeError(f"Ray {ray.__version__}'s Dataset has no iter_internal_ref_bundles, which --data "
                           f"streams through")
    return method()


def address_and_port() -> tuple[str, int]:
    """This node's IP address and a free port on it (what Ray Train's backends give rank 0's address)."""
    import socket

    import ray

    addr = ray.util.get_node_ip_address()
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        return addr, s.getsockname()[1]


def draining_nodes() -> dict[str, int] | None:
    """The nodes the GCS lists as draining, node id -> deadline in ms since the epoch (0: none given); None
    where this Ray has no such call (a preemption notice then comes only from SIGTERM or a preStop file)."""
    try:
        import ray._private.state as state
    except ImportError:
        return None
    get = getattr(getattr(state, "state", None), "get_draining_nodes", None)
    return None if get is None else dict(get())


def report_indices() -> tuple[int, int] | None:
    """(the index of this worker's latest ``ray.train.report`` call, the index its upload thread has put on
    the result queue) from Ray Train v2's train context; None where this Ray does not keep them."""
    try:
        from ray.train.v2._internal.execution.context import get_train_context

        ctx = get_train_context()
        return int(ctx.report_call_index), int(ctx.current_report_index)
    except Exception:  # noqa: BLE001 (another Ray, or not in a Ray Train worker)
        return None


@contextlib.contextmanager
def failure_policy(create: Callable[[Any, Any, Any], Any]) -> Iterator[bool]:
    """Inside the block Ray Train's trainers create their failure policy with ``create(failure_config,
    DefaultFailurePolicy, FailureDecision)``; yields False (and changes nothing) where this Ray has no such
    factory, so the caller can say what that costs."""
    try:
        import ray.train.v2.api.data_parallel_trainer as dpt
        from ray.train.v2._internal.execution.failure_handling import DefaultFailurePolicy, FailureDecision
    except ImportError:
        yield False
        return
    original = getattr(dpt, "create_failure_policy", None)
    if original is None:
        yield False
        return
    dpt.create_failure_policy = lambda config: create(config, DefaultFailurePolicy, FailureDecision)
    try:
        yield True
    finally:
        dpt.create_failure_policy = original
