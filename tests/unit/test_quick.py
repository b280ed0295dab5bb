"""The quick watch at its edge (issue 21): QuickProbe's Ray node list and /health over kept-alive connections,
against a real HTTP server on 127.0.0.1 (ThreadingHTTPServer, HTTP/1.1 as Ray's dashboard and vLLM answer).
Every way the other side can fail is a reading (RayObservation unreachable with what went wrong; /health
refused or in error), never an exception, and never a wait past the probe's timeout."""

from __future__ import annotations

import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from spark_supervisor.adapters.quick import KeptAlive, QuickProbe
from spark_supervisor.model import EndpointObservation, EndpointState, RayObservation

NODES_PATH = "/api/v0/nodes"


def envelope(rows: Any, **result: Any) -> bytes:
    """The dashboard's /api/v0/nodes answer around ``rows``."""
    return json.dumps({"result": True, "msg": "", "data": {"result": {"result": rows, **result}}}).encode()


ROWS = [{"node_id": "ab" * 28, "node_ip": "192.168.200.12", "state": "ALIVE", "is_head_node": True,
         "resources_total": {"GPU": 1.0, "CPU": 20.0}},
        {"node_id": "cd" * 28, "node_ip": "192.168.200.13", "state": "DEAD", "is_head_node": False,
         "resources_total": {"GPU": 1.0}}]


class Server(http.server.ThreadingHTTPServer):
    """Answers each path as told (status, body); counts the connections it accepts and the requests."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.answers: dict[str, tuple[int, bytes]] = {}
        self.requests: list[str] = []
        self.connections = 0
        self.lock = threading.Lock()
        self.hang_up = False  # close each connection after its answer without saying so (an idle timeout)
        self.short = False  # promise more body than is sent, then close (a server dying mid-answer)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def do_GET(self) -> None:
        self.server.requests.append(self.path)
        status, body = self.server.answers.get(self.path.split("?")[0], (404, b""))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body) + (100 if self.server.short else 0)))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = self.server.hang_up or self.server.short

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield s
    finally:
        s.shutdown()
        s.server_close()


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A port bound (no one else takes it) where nothing listens: a connect is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A listener that accepts (its backlog) and never answers."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


@pytest.fixture
def probe() -> Iterator[list[QuickProbe]]:
    """Probes made by a test, closed at its end."""
    made: list[QuickProbe] = []
    yield made
    for p in made:
        p.close()


def quick(made: list[QuickProbe], ray: str, api: str, timeout: float = 5.0) -> QuickProbe:
    p = QuickProbe(ray, api, timeout=timeout)
    made.append(p)
    return p


# ----------------------------------------------------------------------------------------- Ray's nodes
def test_the_node_list_is_read_from_the_dashboard(server: Server, probe: list[QuickProbe]) -> None:
    server.answers[NODES_PATH] = (200, envelope(ROWS, total=2))
    r = quick(probe, server.url, server.url).ray_nodes()
    assert r is not None and r.reachable and r.error == "" and r.via == "dashboard" and r.incomplete == ""
    assert [(n.ip, n.alive, n.gpus, n.is_head) for n in r.nodes] == [
        ("192.168.200.12", True, 1.0, True), ("192.168.200.13", False, 1.0, False)]
    assert server.requests == [f"{NODES_PATH}?limit=100"]


def test_a_truncated_list_is_read_and_said_incomplete(server: Server, probe: list[QuickProbe]) -> None:
    server.answers[NODES_PATH] = (200, envelope(ROWS[:1], total=2, num_after_truncation=1))
    r = quick(probe, server.url, server.url).ray_nodes()
    assert r is not None and r.reachable and len(r.nodes) == 1 and "truncated: 1 of 2 rows" in r.incomplete


def test_an_error_status_is_unreachable_with_the_status_and_the_next_answer_is_read(
        server: Server, probe: list[QuickProbe]) -> None:
    server.answers[NODES_PATH] = (503, b'{"result": false, "msg": "GCS unavailable"}')
    p = quick(probe, server.url, server.url)
    assert p.ray_nodes() == RayObservation(False, "HTTP 503")
    server.answers[NODES_PATH] = (200, envelope(ROWS))
    r = p.ray_nodes()
    assert r is not None and r.reachable and len(r.nodes) == 2
    assert server.connections == 1  # the connection is kept across an error status


@pytest.mark.parametrize(("body", "error"), [
    (b"<html>Bad Gateway</html>", "JSONDecodeError"),  # not JSON
    (b"", "JSONDecodeError"),
    (b"[]", "TypeError"),  # JSON, not the envelope
    (b"null", "TypeError"),
    (b'{"data": {}}', "KeyError"),  # the envelope without the list
    (b'{"data": {"result": {"result": {"node_id": "x"}}}}', "TypeError"),  # a list that is not one
    (b'{"data": "result"}', "TypeError"),
])
def test_a_malformed_answer_is_unreachable_with_what_was_wrong(server: Server, probe: list[QuickProbe],
                                                               body: bytes, error: str) -> None:
    server.answers[NODES_PATH] = (200, body)
    assert quick(probe, server.url, server.url).ray_nodes() == RayObservation(False, error)


def test_rows_that_are_not_objects_are_skipped_and_said(server: Server, probe: list[QuickProbe]) -> None:
    server.answers[NODES_PATH] = (200, envelope([ROWS[0], "garbage", 7]))
    r = quick(probe, server.url, server.url).ray_nodes()
    assert r is not None and r.reachable and len(r.nodes) == 1 and r.incomplete == "2 unreadable rows"


def test_a_refused_dashboard_is_unreachable(refused_url: str, probe: list[QuickProbe]) -> None:
    assert quick(probe, refused_url, refused_url).ray_nodes() == RayObservation(False, "ConnectionRefusedError")


def test_a_dashboard_that_never_answers_is_unreachable_within_the_timeout(silent_url: str,
                                                                         probe: list[QuickProbe]) -> None:
    p = quick(probe, silent_url, silent_url, timeout=0.5)
    t0 = time.monotonic()
    assert p.ray_nodes() == RayObservation(False, "TimeoutError")
    assert time.monotonic() - t0 < 30  # bounded by its timeout, not by the server (generous on a busy machine)


def test_an_answer_cut_short_is_unreachable(server: Server, probe: list[QuickProbe]) -> None:
    server.short = True
    server.answers[NODES_PATH] = (200, envelope(ROWS))
    assert quick(probe, server.url, server.url).ray_nodes() == RayObservation(False, "IncompleteRead")


def test_without_ray_the_node_list_is_not_asked(server: Server, probe: list[QuickProbe]) -> None:
    server.answers["/health"] = (200, b"")
    p = quick(probe, "", server.url)
    assert p.ray_nodes() is None and p.health().state == EndpointState.UP
    assert server.requests == ["/health"]


# ------------------------------------------------------------------------------------------------ /health
@pytest.mark.parametrize("status", [200, 503])
def test_health_answered_is_up_with_its_status(server: Server, probe: list[QuickProbe], status: int) -> None:
    server.answers["/health"] = (status, b"")
    assert quick(probe, server.url, server.url).health() == EndpointObservation(EndpointState.UP, "", status)


def test_health_refused_is_refused(refused_url: str, probe: list[QuickProbe]) -> None:
    assert quick(probe, "", refused_url).health() == EndpointObservation(EndpointState.REFUSED)


def test_health_never_answered_is_an_error_within_the_timeout(silent_url: str, probe: list[QuickProbe]) -> None:
    p = quick(probe, "", silent_url, timeout=0.5)
    t0 = time.monotonic()
    assert p.health() == EndpointObservation(EndpointState.ERROR, "/health: TimeoutError")
    assert time.monotonic() - t0 < 30


def test_one_connection_serves_every_watch(server: Server, probe: list[QuickProbe]) -> None:
    server.answers["/health"] = (200, b"")
    server.answers[NODES_PATH] = (200, envelope(ROWS))
    p = quick(probe, server.url, server.url)
    for _ in range(5):
        assert p.health().health == 200
        r = p.ray_nodes()
        assert r is not None and r.reachable
    assert len(server.requests) == 10 and server.connections == 2  # one kept alive for each of the two


def test_a_kept_alive_connection_the_server_dropped_is_made_again_at_once(server: Server,
                                                                         probe: list[QuickProbe]) -> None:
    server.hang_up = True  # it answers, then closes the connection the client keeps
    server.answers["/health"] = (200, b"")
    p = quick(probe, "", server.url)
    for _ in range(3):
        assert p.health() == EndpointObservation(EndpointState.UP, "", 200)  # never a failure in between
    assert server.connections == 3


def test_after_a_failure_the_next_call_connects_again(refused_url: str, server: Server) -> None:
    k = KeptAlive(refused_url, timeout=5)
    with pytest.raises(ConnectionRefusedError):
        k.get("/health")
    assert k.conn is None  # the failed connection is dropped, not reused
    server.answers["/health"] = (200, b"ok")
    k.url = server.url
    try:
        assert k.get("/health") == (200, b"ok")
    finally:
        assert k.conn is not None
        k.conn.close()


def test_close_ends_the_kept_connections(server: Server) -> None:
    server.answers["/health"] = (200, b"")
    server.answers[NODES_PATH] = (200, envelope(ROWS))
    p = QuickProbe(server.url, server.url, timeout=5)
    p.health()
    p.ray_nodes()
    api, ray = p.api.conn, p.ray.conn
    assert api is not None and api.sock is not None
    assert ray is not None and ray.sock is not None
    p.close()
    assert api.sock is None and ray.sock is None
    assert p.api.conn is None and p.ray.conn is None  # the next call connects afresh
    QuickProbe("", server.url).close()  # a probe that never connected closes too


def test_an_https_endpoint_gets_a_verified_tls_connection_and_a_plain_one_does_not() -> None:
    """vLLM may serve TLS (--ssl-keyfile): the quick checks and /metrics must then speak it, as httpx does."""
    import ssl

    from spark_supervisor.adapters.quick import connection
    tls = connection("https://spark-1:8443", 1)
    assert isinstance(tls, http.client.HTTPSConnection) and (tls.host, tls.port) == ("spark-1", 8443)
    assert tls._context.verify_mode == ssl.CERT_REQUIRED  # type: ignore[attr-defined]
    plain = connection("http://127.0.0.2:8000", 1)
    assert not isinstance(plain, http.client.HTTPSConnection) and (plain.host, plain.port) == ("127.0.0.2", 8000)


def test_metrics_past_the_bound_are_refused_and_the_heartbeat_read_from_a_real_page(server: Server) -> None:
    from spark_supervisor.adapters import vllm
    api = vllm.VllmApi(None, server.url, api_key="k", timeout=5)  # type: ignore[arg-type]  # no httpx for /metrics
    server.answers["/metrics"] = (200, b'vllm:num_requests_running{engine="0"} 1\nvllm:generation_tokens_total 9\n')
    try:
        e = api.engine()
        assert (e.running, e.generated, e.error) == (1, 9, "")
        server.answers["/metrics"] = (200, b"#" * (vllm.MAX_METRICS_BYTES + 10))
        assert api.engine().error == "/metrics: more than 4 MiB"
        assert api.kept.conn is None  # the rest of that body is not taken for the next answer
        server.answers["/metrics"] = (503, b"")
        assert api.engine().error == "/metrics answered HTTP 503"
        assert api.engine().error == "/metrics answered HTTP 503"
        assert server.connections == 2  # kept alive, but for the page over the bound
        server.short, server.answers["/metrics"] = True, (200, b"vllm:num_requests_running 1\n")
        assert api.engine().error == "/metrics: IncompleteRead"  # a page cut short is not read as a whole one
        assert api.kept.conn is None
    finally:
        api.kept.close()


def test_an_endpoint_behind_a_path_keeps_it(server: Server) -> None:
    from spark_supervisor.adapters import vllm
    server.answers["/v/health"] = (200, b"")
    server.answers["/v/metrics"] = (200, b'vllm:num_requests_running 3\nvllm:generation_tokens_total 1\n')
    p = QuickProbe("", server.url + "/v/", timeout=5)
    try:
        assert p.health().health == 200
    finally:
        p.close()
    api = vllm.VllmApi(None, server.url + "/v", api_key="", timeout=5)  # type: ignore[arg-type]
    try:
        assert api.engine().running == 3
    finally:
        api.kept.close()


def test_tls_is_verified_against_httpxs_own_ca_list_made_once() -> None:
    import ssl

    from spark_supervisor.adapters import quick
    quick.tls.cache_clear()
    a, b = quick.connection("https://h:1", 1), quick.connection("https://h:2", 1)
    assert a._context is b._context is quick.tls()  # type: ignore[attr-defined]
    assert quick.tls().verify_mode == ssl.CERT_REQUIRED and quick.tls().check_hostname


def test_a_path_http_client_cannot_send_is_sent_percent_encoded_as_httpx_sends_it() -> None:
    """A config may hold a non-ASCII path: http.client would raise (UnicodeEncodeError) out of the check. The path
    is sent as httpx sends it (every printable ASCII character too), and a refused connection is a failed check."""
    import string

    from spark_supervisor.adapters import quick, vllm
    prefixes = [f"/a{c}b" for c in string.printable.strip() if c not in "?#"] + ["/pr\u00e9fix a%20b", "/x/", "/\u200b"]
    for prefix in prefixes:  # every printable ASCII character, as httpx sends it
        url = f"http://h:1{prefix}"
        assert quick.path(url, "/health").encode() == httpx.URL(url.rstrip("/") + "/health").raw_path, prefix
    assert quick.path("http://h:1", "/health") == "/health"
    p = QuickProbe("", "http://127.0.0.1:1/pr\u00e9fix", timeout=1)
    assert p.health().state == "refused"  # it got as far as the connection
    e = vllm.VllmApi(None, "http://127.0.0.1:1/pr\u00e9fix", api_key="", timeout=1).engine()  # type: ignore[arg-type]
    assert e.error == "/metrics: ConnectionRefusedError", e


def test_the_engines_metrics_ride_the_quick_checks_kept_connection(server: Server) -> None:
    """Read every 5 s on a connection of its own, /metrics would find it closed by uvicorn (5 s keep-alive) and
    connect afresh each sweep; the quick check's, used every second, is open (RealBackend shares it)."""
    from spark_supervisor.adapters import vllm
    server.answers["/health"] = (200, b"")
    server.answers["/metrics"] = (200, b"vllm:num_requests_running 2\nvllm:generation_tokens_total 5\n")
    api = vllm.VllmApi(None, server.url, api_key="k", timeout=5)  # type: ignore[arg-type]
    p = QuickProbe("", server.url, timeout=5, api=api.kept)
    try:
        for _ in range(3):
            assert p.health().health == 200
            assert api.engine().running == 2
        assert server.connections == 1
        server.hang_up = True  # the server closes it after an answer: the next call connects again, once
        assert api.engine().running == 2
        assert p.health().health == 200
        assert server.connections == 2
        server.hang_up = False
        assert api.engine().running == 2
        opened = server.connections
        p.close()  # the probe closes only what it opened: the shared connection is its owner's (World.close)
        assert api.engine().running == 2
        assert server.connections == opened
    finally:
        p.close()
        api.kept.close()
