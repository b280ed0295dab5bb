"""The quick watch at its edge (issue 21): QuickProbe's Ray node list and /health over kept-alive connections,
against a real HTTP server on 127.0.0.1 (ThreadingHTTPServer, HTTP/1.1 as Ray's dashboard and vLLM answer).
Every way the other side can fail is a reading (RayObservation unreachable with what went wrong; /health
refused or in error), never an exception, and never a wait past the probe's timeout."""

from __future__ import annotations

import http.client
import http.server
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
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
        # The switches as they were when the request came: a test flips them once it has its answer.
        hang_up, short = self.server.hang_up, self.server.short
        self.server.requests.append(self.path)
        status, body = self.server.answers.get(self.path.split("?")[0], (404, b""))
        self.send_response(status)
        self.send_header("Content-Length", str(len(body) + (100 if short else 0)))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = hang_up or short

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


def closed_by_the_server(k: KeptAlive) -> None:
    """Wait (with a deadline) until the server's close of ``k``'s connection has reached it: a close while idle."""
    import select
    assert k.sock is not None
    deadline = time.monotonic() + 30
    while not select.select([k.sock], [], [], 0.1)[0]:
        assert time.monotonic() < deadline, "the server never closed the connection"


def test_a_kept_alive_connection_the_server_closed_while_idle_is_made_again_before_the_request(
        server: Server, probe: list[QuickProbe]) -> None:
    """uvicorn closes a connection idle for 5 s (Ray's aiohttp, for 75 s): the next check finds it closed before it
    sends, connects again, and is answered: never a failure in between, and nothing retried."""
    server.hang_up = True  # it answers, then closes the connection the client keeps
    server.answers["/health"] = (200, b"")
    p = quick(probe, "", server.url)
    for _ in range(3):
        assert p.health() == EndpointObservation(EndpointState.UP, "", 200)
        closed_by_the_server(p.api)
    assert server.connections == 3 and server.requests == ["/health"] * 3


def test_a_close_that_crosses_the_request_is_that_checks_failure_and_the_next_connects_again(canned: Any) -> None:
    url = canned(b"", True)  # reads the request, closes without an answer
    p = QuickProbe("", url, timeout=5)
    assert p.health() == EndpointObservation(EndpointState.ERROR, "/health: RemoteDisconnected")
    assert p.api.sock is None
    p.close()


def test_after_a_failure_the_next_call_connects_again(refused_url: str, server: Server) -> None:
    k = KeptAlive(refused_url, timeout=5)
    with pytest.raises(ConnectionRefusedError):
        k.get("/health")
    assert k.sock is None  # the failed connection is dropped, not reused
    server.answers["/health"] = (200, b"ok")
    k = KeptAlive(server.url, timeout=5)
    try:
        assert k.get("/health") == (200, b"ok")
        assert k.sock is not None
    finally:
        k.close()


def test_close_ends_the_kept_connections(server: Server) -> None:
    server.answers["/health"] = (200, b"")
    server.answers[NODES_PATH] = (200, envelope(ROWS))
    p = QuickProbe(server.url, server.url, timeout=5)
    p.health()
    p.ray_nodes()
    api, ray = p.api.sock, p.ray.sock
    assert api is not None and ray is not None and api.fileno() >= 0 and ray.fileno() >= 0
    p.close()
    assert api.fileno() == -1 and ray.fileno() == -1
    assert p.api.sock is None and p.ray.sock is None  # the next call connects afresh
    QuickProbe("", server.url).close()  # a probe that never connected closes too


def test_an_https_endpoint_is_spoken_to_in_tls_verified_against_httpxs_ca_list(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM may serve TLS (--ssl-keyfile): the quick checks and /metrics must then speak it, verified as httpx
    verifies (its own CA list, made once). A real TLS server with a certificate of its own: refused as unverified
    by that list, answered over one kept connection once the test trusts it."""
    import ssl
    import subprocess

    from spark_supervisor.adapters import quick
    quick.tls.cache_clear()
    assert quick.tls() is quick.tls() and quick.tls().verify_mode == ssl.CERT_REQUIRED and quick.tls().check_hostname
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost"], check=True, capture_output=True, timeout=60)
    s = Server()
    side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    side.load_cert_chain(cert, key)
    s.socket = side.wrap_socket(s.socket, server_side=True)
    threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    s.answers["/health"] = (200, b"")
    url = f"https://localhost:{s.server_address[1]}"
    try:
        p = QuickProbe("", url, timeout=5)
        assert p.health() == EndpointObservation(EndpointState.ERROR, "/health: SSLCertVerificationError")
        trusting = ssl.create_default_context(cafile=str(cert))
        monkeypatch.setattr(quick, "tls", lambda: trusting)
        for _ in range(3):
            assert p.health() == EndpointObservation(EndpointState.UP, "", 200)
        assert s.connections == 1  # one kept (the refused handshake never reached a handler)
        p.close()
    finally:
        s.shutdown()
        s.server_close()


def test_metrics_past_the_bound_are_refused_and_the_heartbeat_read_from_a_real_page(server: Server) -> None:
    from spark_supervisor.adapters import vllm
    api = vllm.VllmApi(None, server.url, api_key="k", timeout=5)  # type: ignore[arg-type]  # no httpx for /metrics
    server.answers["/metrics"] = (200, b'vllm:num_requests_running{engine="0"} 1\nvllm:generation_tokens_total 9\n')
    try:
        e = api.engine()
        assert (e.running, e.generated, e.error) == (1, 9, "")
        server.answers["/metrics"] = (200, b"#" * (vllm.MAX_METRICS_BYTES + (1 << 20)))
        assert api.engine().error == "/metrics: more than 4 MiB"
        assert api.kept.sock is None  # the rest of that body is not taken for the next answer
        server.answers["/metrics"] = (503, b"")
        assert api.engine().error == "/metrics answered HTTP 503"
        assert api.engine().error == "/metrics answered HTTP 503"
        assert server.connections == 2  # kept alive, but for the page over the bound
        server.short, server.answers["/metrics"] = True, (200, b"vllm:num_requests_running 1\n")
        assert api.engine().error == "/metrics: IncompleteRead"  # a page cut short is not read as a whole one
        assert api.kept.sock is None
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


def test_a_path_http_client_cannot_send_is_sent_percent_encoded_as_httpx_sends_it() -> None:
    """A config may hold a non-ASCII path: http.client would raise (UnicodeEncodeError) out of the check. The path
    is sent as httpx sends it (every printable ASCII character too), and a refused connection is a failed check."""
    import string

    from spark_supervisor.adapters import quick, vllm
    prefixes = [f"/a{c}b" for c in string.printable.strip() if c not in "?#"] + ["/pr\u00e9fix a%20b", "/x/", "/\u200b"]
    for prefix in prefixes:  # every printable ASCII character, as httpx sends it
        url = f"http://h:1{prefix}"
        assert (quick.target(url).path + "/health").encode() == httpx.URL(url.rstrip("/") + "/health").raw_path, prefix
    assert quick.target("http://h:1").path + "/health" == "/health"
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
        closed_by_the_server(api.kept)
        server.hang_up = False
        assert p.health().health == 200
        assert server.connections == 2
        assert api.engine().running == 2
        opened = server.connections
        p.close()  # the probe closes only what it opened: the shared connection is its owner's (World.close)
        assert api.engine().running == 2
        assert server.connections == opened
    finally:
        p.close()
        api.kept.close()


# ------------------------------------------------------------------------------------------- the answer's framing
@pytest.fixture
def canned() -> Iterator[Any]:
    """canned(answer, close, host, heard): a server on ``host`` that reads each request (kept in ``heard``) and sends
    ``answer`` as it is, closing the connection after it if told: framings ThreadingHTTPServer never sends. Skips
    the test on a host without an IPv6 loopback when ``host`` is "::1"."""
    made: list[socket.socket] = []

    def make(answer: bytes, close: bool, host: str = "127.0.0.1", heard: list[bytes] | None = None) -> str:
        try:
            listener = socket.create_server((host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        except OSError as e:  # a host without IPv6 on its loopback
            pytest.skip(f"no {host} here: {e}")
        made.append(listener)

        def serve() -> None:
            while True:
                try:
                    c, _ = listener.accept()
                except OSError:
                    return
                with c:
                    while request := c.recv(65536):
                        if heard is not None:
                            heard.append(request)
                        c.sendall(answer)
                        if close:
                            break
        threading.Thread(target=serve, daemon=True).start()
        port = listener.getsockname()[1]
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    yield make
    for s in made:
        s.close()


def test_a_chunked_answer_is_read_whole_and_the_connection_kept(canned: Any) -> None:
    k = KeptAlive(canned(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", False), 5)
    try:
        assert k.get("/metrics") == (200, b"abcde")
        sock = k.sock
        assert k.get("/metrics") == (200, b"abcde") and k.sock is sock
    finally:
        k.close()


def test_an_answer_that_runs_to_the_close_is_read_whole_and_the_connection_not_kept(canned: Any) -> None:
    k = KeptAlive(canned(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it", True), 5)
    assert k.get("/metrics") == (200, b"all of it")
    assert k.sock is None
    assert k.get("/metrics") == (200, b"all of it")  # and the next one connects again
    k.close()


def test_an_answer_that_says_close_is_read_and_the_connection_not_kept(canned: Any) -> None:
    k = KeptAlive(canned(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok", True), 5)
    assert k.get("/health") == (200, b"ok")
    assert k.sock is None


@pytest.mark.parametrize("answer", [b"SSH-2.0-OpenSSH_9.6\r\n", b"HTTP/1.1 abc OK\r\n\r\n",
                                    b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n"])
def test_an_answer_that_is_not_http_is_an_error_and_the_connection_dropped(canned: Any, answer: bytes) -> None:
    url = canned(answer, False)
    k = KeptAlive(url, 5)
    with pytest.raises(http.client.HTTPException, match="not an HTTP answer"):
        k.get("/health")
    assert k.sock is None
    assert QuickProbe("", url, timeout=5).health() == EndpointObservation(EndpointState.ERROR, "/health: HTTPException")


def test_an_answer_with_nothing_before_the_close_is_a_remote_disconnect(canned: Any) -> None:
    k = KeptAlive(canned(b"", True), 5)
    with pytest.raises(http.client.RemoteDisconnected):
        k.get("/health")
    assert k.sock is None


def test_a_header_that_cannot_be_sent_is_refused_before_anything_is_sent(server: Server) -> None:
    k = KeptAlive(server.url, 5)
    for bad in ({"Authorization": "Bearer a\r\nX-Injected: 1"}, {"X\nY": "1"}, {"Authorization": "caf\u00e9"}):
        with pytest.raises(http.client.HTTPException, match="cannot be sent"):
            k.get("/health", headers=bad)
    assert server.requests == [] and k.sock is None


def test_an_answer_dripped_out_byte_by_byte_is_a_timeout_not_a_wait_without_end() -> None:
    """Each read within the timeout is not enough: a server sending a byte every 50 ms would hold the loop for days."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        stop = threading.Event()

        def drip() -> None:
            c, _ = listener.accept()
            with c:
                c.recv(65536)
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n")
                while not stop.wait(0.05):
                    c.sendall(b"#")
        threading.Thread(target=drip, daemon=True).start()
        k = KeptAlive(f"http://127.0.0.1:{listener.getsockname()[1]}", 0.5)
        t0 = time.monotonic()
        try:
            with pytest.raises(TimeoutError):
                k.get("/metrics")
            assert time.monotonic() - t0 < 30 and k.sock is None
        finally:
            stop.set()


def test_a_connection_past_descriptor_1024_is_kept_alive_as_any_other(server: Server) -> None:
    """select() refuses a descriptor past FD_SETSIZE (ValueError, out of the check): a daemon holding many files
    would have had its quick check raise. The idle check is poll()'s."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"at most {hard} files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    server.answers["/health"] = (200, b"")
    k = KeptAlive(server.url, 5)
    try:
        for _ in range(3):
            assert k.get("/health")[0] == 200
        assert k.sock is not None and k.sock.fileno() > 1024 and server.connections == 1
    finally:
        k.close()
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_an_ipv6_endpoint_is_connected_to_and_named_in_the_host_header_as_httpx_names_it(canned: Any) -> None:
    """The host to connect to without its brackets, the Host header with them (and its port), as httpx sends it."""
    heard: list[bytes] = []
    url = canned(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", True, "::1", heard) + "/v"
    k = KeptAlive(url, 5)
    try:
        assert k.get("/health") == (200, b"ok")
    finally:
        k.close()
    lines = heard[0].decode().split("\r\n")
    assert lines[0] == "GET /v/health HTTP/1.1"
    assert f"Host: {httpx.URL(url).netloc.decode()}" in lines and httpx.URL(url).netloc.startswith(b"[::1]:")
