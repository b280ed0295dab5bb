"""The decision table: (observation, status, config, now) -> phase, reason and actions. Pure.

A pass runs the rule steps in ``RULES`` in order (nodes seen, hygiene, a member rebooted, containers,
placement, Ray, serve, ranks, readiness, liveness); each is a function of the tick's ``Facts`` that a test can call alone, and
the first that returns a decision decides.

The package, by job (each module pure, importing no I/O): ``rules`` (the table and ``plan``), ``facts``
(what the steps read), ``cluster`` (steps 1-5: nodes, hygiene, rebooted, containers, placement, Ray), ``serving``
(steps 6-9: serve, ranks, readiness, liveness), ``gates`` (the image, the model and what lies below vLLM before a start),
``stale`` (stale units; stale and orphaned containers: identity), ``unknown`` (what could not be seen),
``outcome`` (a repair's budget and backoff), ``seen`` (what a tick derives from its observation once: the
log read, the unknowns, /health's result, for the plan, the trackers and the status).

The phase follows from what is observed, never from memory of what was done: stale things present
-> CLEANING; no healthy Ray cluster -> STARTING_RAY; no serve -> STARTING_VLLM; serve not answering
-> LOADING; answering but not yet judged -> VERIFYING; judged sane -> SERVING. Deadlines count from
the moment the current phase was entered (``Status.since``).

Unknown is not absent. An observation that failed (a node that did not answer, Ray's dashboard timing
out, the serve-state exec failing) is never read as "gone": it holds the current phase, is shown in the
reason as ``ObservationUnknown``, and after ``healing.unknown_patience`` turns the phase DEGRADED. Only
positive evidence removes, restarts or launches anything: a container its engine lists as exited or
absent, a Ray node that Ray's (reachable) dashboard does not list alive, a serve whose recorded pid is
not running, a probe failing past its threshold.
"""

from ..config.identity import is_orphan, is_stale  # the hygiene step's owner rules, as the plan's
from .cluster import containers, hygiene, nodes_seen, placement, ray, rebooted
from .facts import Facts, RayView, Rule, ray_view
from .rules import RULES, plan
from .seen import Seen, derive
from .serving import liveness, ranks, readiness, serve
from .stale import stale_units
from .unknown import unknowns

__all__ = ["RULES", "Facts", "RayView", "Rule", "Seen", "containers", "derive", "hygiene", "is_orphan", "is_stale", "liveness",
           "nodes_seen", "placement", "plan", "ranks", "ray", "ray_view", "rebooted", "readiness", "serve", "stale_units",
           "unknowns"]
