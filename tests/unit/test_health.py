"""/health is asked by two clients, the tick's (httpx: VllmApi) and the quick watch's (http.client:
QuickProbe), and read once (adapters.health, completion.health_result). The quick watch wakes the loop when its
reading differs from the tick's: the two must read one server the same, or it would wake every second."""

from __future__ import annotations

import errno
import http.client
import http.server
import socket
import threading
from collections.abc import Callable, Generator

import httpx
import pytest

from spark_supervisor.adapters.health import observed, refused
from spark_supervisor.adapters.quick import QuickProbe
from spark_supervisor.adapters.vllm import VllmApi
from spark_supervisor.judge.completion import health_result
from spark_supervisor.model import EndpointObservation, EndpointState, ProbeResult


class Health(http.server.BaseHTTPRequestHandler):
    code = 200

    def do_GET(self) -> None:
        self.send_response(self.code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def serve(code: int) -> Generator[str, None, None]:
    handler = type("Answer", (Health,), {"code": code})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def hangs_up() -> Generator[str, None, None]:
    """Accepts, then closes without a word (a serve dying mid-answer)."""
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def run() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.close()
    threading.Thread(target=run, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        done.set()
        listener.close()


def closed() -> Generator[str, None, None]:
    """A port nothing listens on: refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield f"http://127.0.0.1:{port}"


def silent() -> Generator[str, None, None]:
    """Accepts and never answers: a timeout."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


SERVERS: dict[str, Callable[[], Generator[str, None, None]]] = {"200": lambda: serve(200), "503": lambda: serve(503), "refused": closed, "hangs up": hangs_up,
           "silent": silent}
EXPECTED = {"200": (EndpointState.UP, ProbeResult.SUCCESS), "503": (EndpointState.UP, ProbeResult.FAILURE),
            "refused": (EndpointState.REFUSED, ProbeResult.FAILURE),
            "hangs up": (EndpointState.ERROR, ProbeResult.UNKNOWN), "silent": (EndpointState.ERROR, ProbeResult.UNKNOWN)}


def both(url: str) -> tuple[EndpointObservation, EndpointObservation]:
    with httpx.Client() as client:
        tick = VllmApi(client, url, api_key="", timeout=0.5).observe_health()
    quick = QuickProbe("", url, timeout=0.5)
    try:
        return tick, quick.health()
    finally:
        quick.close()


@pytest.mark.parametrize("server", list(SERVERS))
def test_the_tick_and_the_quick_watch_read_one_server_the_same(server: str) -> None:
    gen = SERVERS[server]()
    url = next(gen)
    try:
        tick, quick = both(url)
    finally:
        gen.close()
    assert (tick.state, tick.health) == (quick.state, quick.health), (tick, quick)
    assert (tick.state, health_result(tick)) == EXPECTED[server]
    assert health_result(quick) == health_result(tick)


@pytest.mark.parametrize(("failure", "was_refused"), [
    (httpx.ConnectError("[Errno 111] Connection refused"), True),  # httpx: any failed connect but a timeout
    (httpx.ConnectTimeout("timed out"), False),
    (httpx.ReadTimeout("timed out"), False),
    (httpx.RemoteProtocolError("Server disconnected"), False),
    (ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), True),  # http.client: as the OS said
    (OSError(errno.EHOSTUNREACH, "No route to host"), True),
    (OSError(errno.ENETUNREACH, "Network is unreachable"), True),
    (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), True),
    (TimeoutError("timed out"), False),
    (ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), False),
    (http.client.RemoteDisconnected("Remote end closed connection"), False),
    (http.client.BadStatusLine("x"), False),
])
def test_a_failed_connect_is_refused_by_either_clients_exception(failure: BaseException, was_refused: bool) -> None:
    assert refused(failure) is was_refused
    assert observed(failure=failure).state == (EndpointState.REFUSED if was_refused else EndpointState.ERROR)


def test_the_states_are_judged_once() -> None:
    assert health_result(None) == ProbeResult.UNKNOWN
    assert health_result(EndpointObservation(EndpointState.UNKNOWN)) == ProbeResult.UNKNOWN
    result = health_result(observed(200))
    assert result == ProbeResult.SUCCESS and f"{result}" == "success"  # a str: written and labelled as its value
    assert health_result(observed(503)) == ProbeResult.FAILURE
