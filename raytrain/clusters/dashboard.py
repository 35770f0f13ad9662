"""Small HTTP client for a Ray dashboard: reachability, auth headers, nodes and capacity."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from raytrain.capacity import Node
from raytrain.errors import ClusterError

CONNECT_TIMEOUT_S = 5.0
METADATA_KEY = "raytrain"  # in a Ray job's metadata: the job is raytrain's (its version)


def normalize_address(address: str) -> str:
    """``host:port`` or ``http(s)://host:port`` -> a dashboard URL. ``ray://`` (Ray Client) is refused."""
    address = address.strip().rstrip("/")
    if address.startswith("ray://"):
        raise ClusterError(
            f"--address {address}: raytrain submits through the Ray Jobs API; give the dashboard address, "
            "e.g. http://HEAD:8265"
        )
    if "://" not in address:
        address = "http://" + address
    return address


def token_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def user_token() -> str | None:
    """A Ray auth token the user configured for remote clusters (same places Ray itself looks)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return os.environ["RAY_AUTH_TOKEN"].strip()
    path = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if path and Path(path).is_file():
        return Path(path).read_text().strip()
    default = Path.home() / ".ray" / "auth_token"
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "token" and default.is_file():
        return default.read_text().strip()
    return None


class Dashboard:
    def __init__(self, address: str, headers: dict[str, str] | None = None):
        self.address = normalize_address(address)
        self.headers = dict(headers or {})

    def get(self, path: str, timeout: float = CONNECT_TIMEOUT_S) -> Any:
        import requests

        url = self.address + path
        try:
            resp = requests.get(url, headers=self.headers, timeout=timeout)
        except requests.exceptions.RequestException as exc:
            raise ClusterError(
                f"cannot reach the Ray cluster at {self.address} ({type(exc).__name__}); "
                "is it running? (`raytrain cluster up` starts the local one; check --address)"
            ) from exc
        if resp.status_code in (401, 403):
            raise ClusterError(
                f"the Ray cluster at {self.address} refused raytrain's credentials (HTTP {resp.status_code}); "
                "give its token with RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"
            )
        try:
            data = resp.json()
        except ValueError:  # an HTML page, or anything else a Ray dashboard never answers with
            what = f"{path} answered HTTP {resp.status_code}, {resp.headers.get('Content-Type') or 'no content type'}"
            if resp.status_code >= 500:  # a dashboard in trouble may answer so: say it, without the page
                raise ClusterError(f"{url}: HTTP {resp.status_code} ({what})") from None
            raise self.not_a_dashboard(what) from None
        if resp.status_code >= 400:
            raise ClusterError(f"{url}: HTTP {resp.status_code}: {str(data)[:200]}")
        return data

    def not_a_dashboard(self, why: str) -> ClusterError:
        return ClusterError(
            f"not a Ray dashboard at {self.address} ({why}); check --address: the Ray dashboard's URL, "
            "e.g. http://HEAD:8265"
        )

    def check_reachable(self) -> dict:
        """The cluster's version info; a clear ClusterError within a few seconds otherwise."""
        data = self.get("/api/version")
        if not isinstance(data, dict) or "ray_version" not in data:
            raise self.not_a_dashboard("/api/version has no ray_version")
        return data

    def nodes(self) -> list[Node]:
        data = self.get("/nodes?view=summary")
        out = []
        for entry in (data.get("data") or {}).get("summary") or []:
            raylet = entry.get("raylet") or {}
            state = raylet.get("state") or (raylet.get("stateSnapshot") or {}).get("state") or "ALIVE"
            out.append(
                Node(
                    node_id=raylet.get("nodeId", ""),
                    address=raylet.get("nodeManagerAddress") or entry.get("ip", ""),
                    resources=dict(raylet.get("resourcesTotal") or {}),
                    alive=str(state).upper() in ("ALIVE", "ACTIVE", "IDLE"),
                    hostname=entry.get("hostname", ""),
                    labels=dict(raylet.get("labels") or {}),
                )
            )
        return out

    def node_summaries(self) -> list[dict]:
        """Raw per-node summary (memory, CPU use) for `cluster status`."""
        return ((self.get("/nodes?view=summary").get("data") or {}).get("summary")) or []

    def _state(self, resource: str, query: str = "") -> list[dict]:
        data = self.get(f"/api/v0/{resource}?limit=10000{query}", timeout=15)
        return ((data.get("data") or {}).get("result") or {}).get("result") or []

    def placement_groups(self) -> list[dict]:
        """Ray's state API: every placement group with its state, creator job and bundles."""
        return self._state("placement_groups", "&detail=1")

    def live_actors(self, ray_job_id: str) -> list[dict]:
        """The actors of one Ray job (its id, e.g. ``03000000``) that are not dead (with ``is_detached``)."""
        actors = self._state("actors", f"&detail=1&filter_keys=job_id&filter_predicates=%3D&filter_values={ray_job_id}")
        return [a for a in actors if str(a.get("state", "")).upper() != "DEAD"]
