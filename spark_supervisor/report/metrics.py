"""Prometheus metrics (prometheus_client), served on [metrics] listen; off by default.

prometheus_client is imported only when metrics are on, to keep the idle daemon small. The alert rules and
the dashboard in monitoring/ read these names (tests/unit/test_monitoring.py holds them to it).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import socket
import socketserver
import threading
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIServer

from ..adapters import UNEXPECTED
from ..config.view import DeploymentView
from ..judge import fabric
from ..model import HostFacts, Kind, Observation, PerfVerdict, Phase, Status, Verdict

if TYPE_CHECKING:
    from wsgiref.types import WSGIApplication

    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from ..config import Node


def serve(app: WSGIApplication, host: str, port: int) -> tuple[WSGIServer, threading.Thread]:
    """prometheus_client's WSGI app on a thread per connection, as its start_http_server does, but at most
    CappedServer.MAX_CONNECTIONS at once (more are closed at once) and each socket with a timeout: scrapers
    that open connections and never finish cannot grow the daemon's threads or memory without bound."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    class Quiet(WSGIRequestHandler):
        """Its request line and headers within HEADER_DEADLINE_S in all, or the connection is shut: an idle or
        dribbling client holds a slot for that long, not for the socket's timeout at each byte."""

        def setup(self) -> None:
            super().setup()
            self._deadline = threading.Timer(CappedServer.HEADER_DEADLINE_S, self._expire)
            self._deadline.daemon = True
            self._deadline.start()

        def _expire(self) -> None:
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

        def parse_request(self) -> bool:
            self._deadline.cancel()  # the headers are in: the scrape itself has the socket's timeout
            return bool(super().parse_request())

        def finish(self) -> None:
            self._deadline.cancel()
            super().finish()

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002  (each scrape is not news)
            pass

    server_class = CappedServer6 if ":" in host else CappedServer
    httpd = make_server(host, port, app, server_class, handler_class=Quiet)
    t = threading.Thread(target=httpd.serve_forever, daemon=True, name="metrics")
    t.start()
    return httpd, t


class CappedServer(socketserver.ThreadingMixIn, WSGIServer):
    """At most MAX_CONNECTIONS at once, PER_PEER of them from one address (one user's idle connections cannot
    take every slot from a scraper elsewhere), each with HEADER_DEADLINE_S for its request's headers.

    Heavy but earned: no request from outside can hold the daemon's threads or memory (a slow or hostile
    scraper costs it a slot, not the loop). Test before you simplify it."""

    MAX_CONNECTIONS = 16
    PER_PEER = 4
    HEADER_DEADLINE_S = 2.0
    TIMEOUT_S = 10.0
    daemon_threads = True

    def server_activate(self) -> None:
        self._slots = threading.BoundedSemaphore(self.MAX_CONNECTIONS)
        self._peers: dict[str, int] = {}
        self._peers_lock = threading.Lock()
        super().server_activate()

    def _enter(self, peer: str) -> bool:
        with self._peers_lock:
            if self._peers.get(peer, 0) >= self.PER_PEER:
                return False
            self._peers[peer] = self._peers.get(peer, 0) + 1
            return True

    def _leave(self, peer: str) -> None:
        with self._peers_lock:
            left = self._peers.get(peer, 1) - 1
            if left > 0:
                self._peers[peer] = left
            else:
                self._peers.pop(peer, None)

    # socketserver's types: a stream server's request is its socket, its address whatever the family's is
    def process_request(self, request: socket.socket | tuple[bytes, socket.socket], client_address: object) -> None:
        peer = str(client_address[0]) if isinstance(client_address, tuple) and client_address else "?"
        if not self._enter(peer):
            self.shutdown_request(request)  # this address holds its share: closed, the others go on
            return
        if not self._slots.acquire(blocking=False):
            self._leave(peer)
            self.shutdown_request(request)  # too many under way: this one is closed, the rest go on
            return
        if isinstance(request, socket.socket):  # always, on a stream server
            request.settimeout(self.TIMEOUT_S)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            self._leave(peer)
            raise

    def process_request_thread(self, request: socket.socket | tuple[bytes, socket.socket],
                               client_address: object) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()
            self._leave(str(client_address[0]) if isinstance(client_address, tuple) and client_address else "?")


class CappedServer6(CappedServer):
    address_family = socket.AF_INET6


class _Unexpected:
    """adapters.UNEXPECTED as a counter: probes that raised what no adapter foresees (each a bug to report; the
    probe's reading was unknown, nothing acted on it). Process-wide: a probe is not any one deployment's."""

    def __init__(self, prefix: str):
        self.name = f"{prefix}probe_unexpected_errors"

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(self.name, "probes that raised an unforeseen exception (its reading: unknown)",
                                     labels=["probe"])
        for probe, n in sorted(UNEXPECTED.items()):
            family.add_metric([probe], n)
        yield family


class Metrics:
    def __init__(self, host: str, port: int):
        """Serving on ``host``:``port`` ([metrics] listen, read: config.Metrics.address)."""
        import prometheus_client as pc

        self.registry = reg = pc.CollectorRegistry()
        p = "spark_supervisor_"
        d = ["deployment"]  # every metric of a deployment is labelled with it
        self.phase = pc.Gauge(f"{p}phase", "1 for the current phase", [*d, "phase"], registry=reg)
        self.in_phase = pc.Gauge(f"{p}phase_seconds", "seconds in the current phase", d, registry=reg)
        self.ttr = pc.Gauge(f"{p}time_to_ready_seconds", "last start (or repair) to SERVING", d, registry=reg)
        self.repairs = pc.Counter(f"{p}repairs", "repairs started", [*d, "kind", "reason"], registry=reg)
        self.failures = pc.Gauge(f"{p}consecutive_failures", "failed attempts in a row", d, registry=reg)
        self.probe_latency = pc.Gauge(f"{p}probe_latency_seconds", "last completion probe latency", [*d, "probe"],
                                      registry=reg)
        self.probes = pc.Counter(f"{p}probe_results", "completion and /health probe results", [*d, "probe", "result"],
                                 registry=reg)
        self.load = pc.Gauge(f"{p}load_progress_ratio", "model load progress, 0..1", d, registry=reg)
        self.eta = pc.Gauge(f"{p}load_eta_seconds", "estimated seconds until the model serves", d, registry=reg)
        self.ray_nodes = pc.Gauge(f"{p}ray_nodes_alive", "Ray nodes ALIVE", d, registry=reg)
        self.gpus = pc.Gauge(f"{p}ray_gpus", "GPUs registered by the alive Ray nodes", d, registry=reg)
        self.budget = pc.Gauge(f"{p}repair_budget_used", "repairs in the current window", d, registry=reg)
        self.unknowns = pc.Counter(f"{p}observations_unknown", "ticks in which something could not be seen",
                                   [*d, "what"], registry=reg)
        self.page_cache_drops = pc.Counter(f"{p}page_cache_drops", "page cache dropped before a launch", [*d, "node"],
                                           registry=reg)
        self.kv_tokens = pc.Gauge(f"{p}kv_cache_tokens", "KV-cache tokens the serve reported at start", d, registry=reg)
        self.kv_best = pc.Gauge(f"{p}kv_cache_best_tokens", "best KV-cache tokens seen for this spec", d, registry=reg)
        self.kv_regressed = pc.Gauge(f"{p}kv_cache_regression", "1 when the serve came up with far less KV cache "
                                     "than the best for its spec", d, registry=reg)
        self.state_write_errors = pc.Counter(f"{p}state_write_errors", "failed writes of a state file",
                                             ["file"], registry=reg)
        # For the alert rules: what each threshold is measured against, and what no counter tells.
        self.reason = pc.Info(f"{p}phase_reason", "the current phase and the kind of its reason", d, registry=reg)
        self.budget_max = pc.Gauge(f"{p}repair_budget", "repairs allowed in the window (healing.repair_budget)", d,
                                   registry=reg)
        self.window = pc.Gauge(f"{p}repair_window_seconds", "the repair budget's window (healing.repair_window)", d,
                               registry=reg)
        self.stalled = pc.Gauge(f"{p}load_stalled_seconds", "seconds since the load last progressed, while LOADING; "
                                "else 0", d, registry=reg)
        self.stall_timeout = pc.Gauge(f"{p}load_stall_timeout_seconds", "no load progress this long is repaired "
                                      "(the load's stall limit: readiness.stall_timeout, or learned from its key's "
                                      "good loads)", d, registry=reg)
        self.node_up = pc.Gauge(f"{p}node_up", "1 when the node (SSH, Docker engine) was observed in the last tick, "
                                "0 when it could not be", [*d, "node"], registry=reg)
        self.ray_expected = pc.Gauge(f"{p}ray_nodes_expected", "Ray nodes the deployment needs (its nodes)", d,
                                     registry=reg)
        self.unknown_for = pc.Gauge(f"{p}observation_unknown_seconds", "seconds something has not been seen in a "
                                    "row (0: seen)", [*d, "what"], registry=reg)
        self.changes_refused = pc.Counter(f"{p}changes_refused", "reloads refused because the new spec could not "
                                          "be proven startable (the old one kept serving)", d, registry=reg)
        self.engine_running = pc.Gauge(f"{p}engine_requests_running", "requests the engine runs (its /metrics; NaN: "
                                       "not read)", d, registry=reg)
        self.engine_waiting = pc.Gauge(f"{p}engine_requests_waiting", "requests waiting in the engine (its /metrics; "
                                       "NaN: not read)", d, registry=reg)
        self.engine_still = pc.Gauge(f"{p}engine_heartbeat_age_seconds", "seconds since the engine's token counters "
                                     "last moved while requests ran (0: idle or moving; NaN: not read)", d, registry=reg)
        self.engine_stalled = pc.Gauge(f"{p}engine_heartbeat_stalled", "1 while requests run and nothing has moved "
                                       "for healing.heartbeat_stall", d, registry=reg)
        self.decode_tps = pc.Gauge(f"{p}decode_tokens_per_second", "decode speed of one stream at the last "
                                   "performance measurement ([deployments.performance])", d, registry=reg)
        self.decode_best = pc.Gauge(f"{p}decode_tokens_per_second_best", "the best decode speed for the serve's "
                                    "key (image IDs, model, serve spec, nodes)", d, registry=reg)
        self.aggregate_tps = pc.Gauge(f"{p}aggregate_tokens_per_second", "tokens per second of the measurement's "
                                      "concurrent streams together (performance.streams > 1)", d, registry=reg)
        self.ttft = pc.Gauge(f"{p}ttft_seconds", "time to first token at the last performance measurement", d,
                             registry=reg)
        self.throughput_regressed = pc.Gauge(f"{p}throughput_regression", "1 when the last measurement was more "
                                             "than performance.regression below the best or the baseline", d,
                                             registry=reg)
        self.alerts = pc.Counter(f"{p}alerts", "alerts sent ([alerts]), by event, channel and result",
                                 [*d, "event", "via", "result"], registry=reg)
        self.below = BelowVllm(pc, reg, p, d)
        reg.register(_Unexpected(p))
        self._unknown_seen: dict[str, set[str]] = {}  # deployment -> every `what` given a series
        self._nodes_seen: dict[str, set[str]] = {}  # deployment -> its nodes given a series
        self.server, self.thread = serve(pc.make_wsgi_app(reg), host, port)

    def bound(self, deployment: str) -> DeploymentMetrics:
        return DeploymentMetrics(self, deployment)

    def update(self, dep: str, st: Status, obs: Observation | None, now: float,
               view: DeploymentView | None = None) -> None:
        """After each tick. ``now`` is the clock of ``st``; ``view`` (the deployment's) adds the limits, and the
        series below vLLM (BelowVllm: they need its members)."""
        for phase in Phase:
            self.phase.labels(dep, phase.value).set(1 if phase == st.phase else 0)
        self.reason.labels(dep).info({"phase": st.phase.value, "reason": st.why.kind})
        self.in_phase.labels(dep).set(round(now - st.since, 3))
        self.failures.labels(dep).set(st.failures)
        self.load.labels(dep).set(st.load_fraction)
        if st.eta_s is not None:
            self.eta.labels(dep).set(st.eta_s)
        self.budget.labels(dep).set(st.repairs_in_window)
        # As the planner counts a stall (plan/serving.py: LoadStalled).
        loading = st.phase == Phase.LOADING and st.load_progress_at
        self.stalled.labels(dep).set(round(max(0.0, now - st.load_progress_at), 3) if loading else 0)
        hb, unread = st.heartbeat, st.heartbeat.work is None  # unknown is not absent: NaN, not 0 requests
        self.engine_running.labels(dep).set(math.nan if unread else hb.running)
        self.engine_waiting.labels(dep).set(math.nan if unread else hb.waiting)
        self.engine_still.labels(dep).set(math.nan if unread else round(now - hb.moved_at, 3) if hb.running else 0)
        self.engine_stalled.labels(dep).set(1 if hb.stalled_at else 0)
        seen = self._unknown_seen.setdefault(dep, set())
        for what in seen | st.unknown_since.keys():  # seen again: 0, so the series and any alert end
            since = st.unknown_since.get(what)
            self.unknown_for.labels(dep, what).set(round(now - since, 3) if since is not None else 0)
        seen.update(st.unknown_since)
        members = None
        if view is not None:
            cfg, dep_cfg = view.cfg, view.dep
            members = {n.name for n in view.members}
            self.budget_max.labels(dep).set(cfg.healing.repair_budget)
            self.window.labels(dep).set(cfg.healing.repair_window)
            lim = st.load_limits if st.phase == Phase.LOADING else None  # the load's own (learned or cold)
            self.stall_timeout.labels(dep).set(lim.stall if lim is not None else dep_cfg.readiness.stall_timeout)
            if dep_cfg.uses_ray:
                self.ray_expected.labels(dep).set(len(members))
            else:  # mp (or reloaded onto it): no Ray to expect
                with contextlib.suppress(KeyError):
                    self.ray_expected.remove(dep)
            self.below.update(dep, st, view)
        nodes = self._nodes_seen.setdefault(dep, set())
        for gone in nodes - members if members is not None else ():  # reloaded without it: no stale alert
            self.node_up.remove(dep, gone)
            nodes.discard(gone)
        if obs is None:
            return
        for name, node in obs.nodes.items():
            if members is None or name in members:
                self.node_up.labels(dep, name).set(0 if node.error else 1)
                nodes.add(name)
        if obs.ray is not None:
            # Unknown is not absent: Ray that did not answer is NaN (no comparison holds), not 0 nodes alive.
            # No head container is a real 0.
            known = obs.ray.reachable or obs.ray.error == Kind.RAY_HEAD_NOT_RUNNING
            self.ray_nodes.labels(dep).set(len(obs.ray.alive) if known else math.nan)
            self.gpus.labels(dep).set(obs.ray.gpus if known else math.nan)

    def performance(self, dep: str, v: PerfVerdict) -> None:
        """A performance verdict: its figures (NaN when it could not be measured: unknown, not 0 tok/s)."""
        self.decode_tps.labels(dep).set(math.nan if v.error else v.decode_tps)
        self.ttft.labels(dep).set(math.nan if v.error else v.ttft_s)
        self.aggregate_tps.labels(dep).set(v.aggregate_tps if v.aggregate_tps else math.nan)
        if v.best_tps:
            self.decode_best.labels(dep).set(v.best_tps)
        self.throughput_regressed.labels(dep).set(1 if v.regression else 0)

    def repaired(self, dep: str, kind: str, reason_kind: str) -> None:
        self.repairs.labels(dep, kind, reason_kind).inc()

    def unknown(self, dep: str, what: str) -> None:
        self.unknowns.labels(dep, what).inc()

    def page_cache_dropped(self, dep: str, node: str) -> None:
        self.page_cache_drops.labels(dep, node).inc()

    def kv_cache(self, dep: str, tokens: int, best: int, regressed: bool) -> None:
        self.kv_tokens.labels(dep).set(tokens)
        self.kv_best.labels(dep).set(best)
        self.kv_regressed.labels(dep).set(1 if regressed else 0)

    def state_write_failed(self, file: str) -> None:
        self.state_write_errors.labels(file).inc()

    def probed(self, dep: str, probe: str, result: str, verdict: Verdict | None = None) -> None:
        self.probes.labels(dep, probe, result).inc()
        if verdict is not None and verdict.ran:
            self.probe_latency.labels(dep, probe).set(verdict.latency_s)

    def ready_after(self, dep: str, seconds: float) -> None:
        self.ttr.labels(dep).set(round(seconds, 3))

    def change_refused(self, dep: str) -> None:
        self.changes_refused.labels(dep).inc()

    def alerted(self, dep: str, event: str, via: str, ok: bool) -> None:
        """One alert sent (or given up on) through one channel ("webhook", "command")."""
        self.alerts.labels(dep, event, via, "ok" if ok else "failed").inc()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class BelowVllm:
    """The series of what lies below vLLM (fabric.py), per member: its fabric link and RDMA port as the last
    full observation read them, GPU access, the fabric problems found and NCCL's transport per rank. A member
    whose reading failed has no series (unknown is neither up nor down); an "unknown" operstate, as on links
    whose driver does not say, is not down, so up (as Link.down and fabric.problems judge it)."""

    def __init__(self, pc: ModuleType, reg: CollectorRegistry, p: str, d: list[str]):
        per_node, per_link, per_port = [*d, "node"], [*d, "node", "interface"], [*d, "node", "device", "port"]
        self.link_up = pc.Gauge(f"{p}fabric_link_up", "1 when the member's fabric interface is not down (its "
                                "operstate; \"unknown\" is not down), 0 when it is; absent when not read", per_link,
                                registry=reg)
        self.link_mtu = pc.Gauge(f"{p}fabric_mtu_bytes", "MTU of the member's fabric interface", per_link,
                                 registry=reg)
        self.link_speed = pc.Gauge(f"{p}fabric_speed_gbps", "link speed of the member's fabric interface (Gb/s; "
                                   "absent when its driver does not say)", per_link, registry=reg)
        self.port_active = pc.Gauge(f"{p}rdma_port_active", "1 when the fabric's RDMA port is ACTIVE, 0 when it is "
                                    "not (DOWN, INIT, ...)", per_port, registry=reg)
        self.port_rate = pc.Gauge(f"{p}rdma_port_rate_gbps", "rate of the fabric's RDMA port (Gb/s)", per_port,
                                  registry=reg)
        self.gid_index = pc.Gauge(f"{p}rdma_gid_index", "the GID index holding the member's fabric IPv4 as RoCE v2 "
                                  "(what NCCL_IB_GID_INDEX must name); -1: none", per_port, registry=reg)
        self.gpu_lost = pc.Gauge(f"{p}gpu_access_lost", "1 when nvidia-smi on the member lost its GPU (NVML "
                                 "\"Unknown Error\"), else 0", per_node, registry=reg)
        self.fabric_problem = pc.Gauge(f"{p}fabric_problem", "1 for each kind of fabric problem found between the "
                                       "members now (FabricLinkDown, FabricMtuMismatch, GidIndexMoved, "
                                       "FabricDegraded, FabricFallback); absent: none found", [*d, "kind"],
                                       registry=reg)
        self.nccl_transport = pc.Gauge(f"{p}nccl_transport", "1 per NCCL rank of the serve that runs: the network it "
                                       "uses between nodes (IB: RDMA, Socket: TCP) and the member it runs on "
                                       "(\"\": no member has its IP; rank \"?\": not said yet)",
                                       [*d, "rank", "node", "transport"], registry=reg)
        self._gauges = (self.link_up, self.link_mtu, self.link_speed, self.port_active, self.port_rate,
                       self.gid_index, self.gpu_lost, self.fabric_problem, self.nccl_transport)
        # deployment -> what its series were computed from, and its series (gauge -> labels -> value)
        self._of: dict[str, tuple[DeploymentView, tuple[Any, ...]]] = {}
        self._set: dict[str, dict[Any, dict[tuple[str, ...], float]]] = {}

    def update(self, dep: str, st: Status, view: DeploymentView) -> None:
        """The fabric, GPU access and NCCL transport series, from the status's facts and fabric.py's judgement
        of them (fabric.judged: the one kept on the status).
        Recomputed only when those facts (or the view) differ from last time, the same objects compared at once
        (`is` before ==): every tick is cheap.
        Series no longer given (a member not read, gone from the view, a problem gone, a rank gone) are
        removed, so none stays at a stale value."""
        facts = (tuple(st.hosts.items()), st.transports, tuple(st.gpu_lost.items()))
        last = self._of.get(dep)
        if last is not None and (last[0] is view or last[0] == view) and last[1] == facts:
            return
        self._of[dep] = (view, facts)
        want: dict[Any, dict[tuple[str, ...], float]] = {g: {} for g in self._gauges}
        for node in view.members:
            want[self.gpu_lost][dep, node.name] = 1 if st.gpu_lost.get(node.name) else 0
            host = st.hosts.get(node.name)
            if host is not None:  # not read: unknown, so no series at all (least of all one that says up)
                self._host_series(want, dep, node, host)
        judged = fabric.judged(view, st)
        for r in [*judged.problems, *([judged.fallback] if judged.fallback else [])]:
            want[self.fabric_problem][dep, r.kind] = 1
        for t in st.transports:
            m = fabric.member(view, t)
            want[self.nccl_transport][dep, "?" if t.rank is None else str(t.rank), m.name if m else "", t.net] = 1
        had = self._set.get(dep, {})
        for gauge, series in want.items():
            for labels in had.get(gauge, {}).keys() - series.keys():
                gauge.remove(*labels)
            for labels, value in series.items():
                gauge.labels(*labels).set(value)
        self._set[dep] = want

    def _host_series(self, want: dict[Any, dict[tuple[str, ...], float]], dep: str, node: Node,
                     host: HostFacts) -> None:
        """One member's fabric link and RDMA ports, each figure only where it was read."""
        link = fabric.fabric_link(node, host)
        if link is not None:
            on_link = (dep, node.name, link.name)
            if link.operstate:
                want[self.link_up][on_link] = 0 if link.down else 1
            if link.mtu is not None:
                want[self.link_mtu][on_link] = link.mtu
            if link.speed_mbps is not None:
                want[self.link_speed][on_link] = link.speed_mbps / 1000
        for p in host.ports_on(node.fabric_interface, node.fabric_ip):
            at = (dep, node.name, p.device, str(p.port))
            if p.state:
                want[self.port_active][at] = 1 if p.active else 0
            if p.rate_gbps is not None:
                want[self.port_rate][at] = p.rate_gbps
            index = p.roce_v2_index(node.fabric_ip)
            want[self.gid_index][at] = -1 if index is None else index


class DeploymentMetrics:
    """One deployment's handle on the shared metrics: the same calls, its name as the first label."""

    def __init__(self, metrics: Metrics | NoMetrics, deployment: str):
        self.metrics, self.deployment = metrics, deployment

    def __getattr__(self, name: str) -> Callable[..., None]:
        fn = getattr(self.metrics, name)
        return lambda *a, **k: fn(self.deployment, *a, **k)


class NoMetrics:
    """Metrics off: the same calls as Metrics, nothing done. Only the same calls: a name Metrics has no
    method for, or arguments its method would not take, raise here too, so a misspelt call fails the
    tests (which run with metrics off) instead of passing until someone turns metrics on."""

    def bound(self, deployment: str) -> DeploymentMetrics:
        return DeploymentMetrics(self, deployment)

    def __getattr__(self, name: str) -> Callable[..., None]:
        method = None if name.startswith("_") else getattr(Metrics, name, None)
        if not callable(method):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r} (nor has Metrics)")
        signature = inspect.signature(method)

        def nothing(*args: object, **kwargs: object) -> None:
            signature.bind(self, *args, **kwargs)  # a TypeError, as the call on Metrics would raise

        # Kept as the instance's own attribute: found at once by the next call, never built again (a signature
        # costs about 0.1 ms, and the loop makes a few such calls each tick).
        setattr(self, name, nothing)
        return nothing
