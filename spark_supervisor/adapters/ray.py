"""Ray's state through its dashboard REST API: no `import ray` in the daemon (it costs ~100 MB).

Every field the planner reads is checked here: one that is missing or malformed becomes unknown (an
empty address, no state, no GPU figure), never a default that reads as evidence (``False``, ``0.0``)."""

from __future__ import annotations

import ipaddress
import json
import math
from typing import Any

import httpx

from ..model import Kind, RayNode, RayObservation
from . import probe

_STATES = {"ALIVE": True, "DEAD": False}


def _ip(v: object) -> str:
    if not isinstance(v, str):
        return ""
    try:
        return str(ipaddress.ip_address(v.strip()))
    except ValueError:
        return ""


def _gpus(resources: object) -> float | None:
    v = resources.get("GPU") if isinstance(resources, dict) else None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        return None
    return float(v)


def _node(r: dict[str, Any]) -> RayNode:
    node_id = r.get("node_id")
    state = r.get("state")
    return RayNode(node_id=node_id if isinstance(node_id, str) else "", ip=_ip(r.get("node_ip")),
                   alive=_STATES.get(state) if isinstance(state, str) else None,
                   gpus=_gpus(r.get("resources_total")), is_head=r.get("is_head_node") is True)


def _count(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def parse(doc: object, via: str = "dashboard") -> RayObservation:
    """The dashboard's /api/v0/nodes envelope. Raises KeyError/TypeError when it is not one at all (the
    answer says nothing); rows that are not objects and a truncated list make it incomplete."""
    if not isinstance(doc, dict):
        raise TypeError(f"the answer is a {type(doc).__name__}, not an object")
    result = doc["data"]["result"]
    rows = result["result"]
    if not isinstance(rows, list):
        raise TypeError(f"the node list is a {type(rows).__name__}")
    nodes = tuple(_node(r) for r in rows if isinstance(r, dict))
    gaps = []
    if len(nodes) < len(rows):
        gaps.append(f"{len(rows) - len(nodes)} unreadable row{'s' if len(rows) - len(nodes) > 1 else ''}")
    total = _count(result.get("total")) if isinstance(result, dict) else None
    kept = _count(result.get("num_after_truncation")) if isinstance(result, dict) else None
    if (total is not None and total > len(rows)) or (kept is not None and kept > len(rows)):
        gaps.append(f"truncated: {len(rows)} of {max(total or 0, kept or 0)} rows")
    warning = result.get("partial_failure_warning") if isinstance(result, dict) else None
    if warning:
        gaps.append(f"partial: {str(warning)[:120]}")
    return RayObservation(True, nodes=nodes, via=via, incomplete="; ".join(gaps))


def read_nodes(text: str, via: str) -> RayObservation:
    """The node table as JSON in the dashboard's envelope (from the dashboard or commands.RAY_NODES)."""
    try:
        return parse(json.loads(text), via)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        return RayObservation(False, f"{Kind.RAY_STATE_UNREADABLE}: {type(e).__name__} {e}"[:200], via=via)


class RayDashboard:
    def __init__(self, client: httpx.Client, url: str, timeout: float):
        self.http, self.url, self.timeout = client, url.rstrip("/"), timeout

    @probe("ray dashboard", lambda e: RayObservation(False, f"{Kind.RAY_DASHBOARD_UNREADABLE}: {e}"[:200]))
    def observe(self) -> RayObservation:
        try:
            r = self.http.get(f"{self.url}/api/v0/nodes", params={"limit": 100}, timeout=self.timeout)
            r.raise_for_status()
            return parse(r.json())
        except httpx.HTTPError as e:
            return RayObservation(False, f"{Kind.RAY_DASHBOARD_UNREACHABLE}: {type(e).__name__} {e}"[:200])
        except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
            return RayObservation(False, f"{Kind.RAY_DASHBOARD_UNREADABLE}: {type(e).__name__} {e}"[:200])
