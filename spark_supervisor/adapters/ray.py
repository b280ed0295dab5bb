"""Ray's state through its dashboard REST API: no `import ray` in the daemon (it costs ~100 MB)."""

from __future__ import annotations

import json

import httpx

from ..model import RayNode, RayObservation


def parse_nodes(doc: dict) -> tuple[RayNode, ...]:  # type: ignore[type-arg]
    rows = doc["data"]["result"]["result"]
    return tuple(RayNode(node_id=r.get("node_id", ""), ip=r.get("node_ip", ""), alive=r.get("state") == "ALIVE",
                         gpus=float((r.get("resources_total") or {}).get("GPU", 0.0)),
                         is_head=bool(r.get("is_head_node"))) for r in rows)


def read_nodes(text: str, via: str) -> RayObservation:
    """The node table as JSON in the dashboard's envelope (from the dashboard or commands.RAY_NODES)."""
    try:
        return RayObservation(True, nodes=parse_nodes(json.loads(text)), via=via)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return RayObservation(False, f"RayStateUnreadable: {type(e).__name__} {e}"[:200], via=via)


class RayDashboard:
    def __init__(self, client: httpx.Client, url: str, timeout: float):
        self.http, self.url, self.timeout = client, url.rstrip("/"), timeout

    def observe(self) -> RayObservation:
        try:
            r = self.http.get(f"{self.url}/api/v0/nodes", params={"limit": 100}, timeout=self.timeout)
            r.raise_for_status()
            nodes = parse_nodes(r.json())
        except httpx.HTTPError as e:
            return RayObservation(False, f"RayDashboardUnreachable: {type(e).__name__} {e}"[:200])
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            return RayObservation(False, f"RayDashboardUnreadable: {e}"[:200])
        return RayObservation(True, nodes=nodes)
