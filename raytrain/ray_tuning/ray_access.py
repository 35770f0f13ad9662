"""Ray internals raytrain reads that are not tunings, each with a public-API fallback for a Ray that moved
them. The contract test (tests/unit/test_ray_tuning_contracts.py) checks each one still exists."""
from __future__ import annotations

import importlib.util
from typing import Any, Iterator

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
