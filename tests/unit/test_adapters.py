"""Adapter building blocks that need no peer: the hard deadline every Docker call runs under."""

import threading
from pathlib import Path

import pytest

from spark_supervisor.adapters import TransientError, within


def test_a_call_that_hangs_is_abandoned_at_its_deadline_and_the_heartbeat_keeps_beating() -> None:
    release = threading.Event()
    beats: list[int] = []
    with pytest.raises(TransientError) as e:
        within(lambda: release.wait(30), 2.5, "pull img on spark-1", heartbeat=lambda: beats.append(1),
               reason="DockerTimeout")
    release.set()
    assert e.value.reason == "DockerTimeout" and "no answer within 2s" in str(e.value)  # rounded, as shown
    assert len(beats) >= 2  # the watchdog was fed while waiting


def test_a_result_and_an_error_come_back_as_they_are() -> None:
    assert within(lambda: 42, 5, "x") == 42

    def boom() -> None:
        raise ValueError("no")
    with pytest.raises(ValueError, match="no"):
        within(boom, 5, "x")


def _io_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("io")]


def test_calls_reuse_idle_threads_and_a_hung_call_holds_up_no_other(monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_supervisor import adapters
    from spark_testbed.testbed import until
    monkeypatch.setattr(adapters, "_WORKERS", adapters._Workers())
    monkeypatch.setattr(adapters._Workers, "IDLE_S", 0.5)
    before = set(_io_threads())
    ran = [within(threading.current_thread, 5, "x") for _ in range(50)]  # each thread kept: no id reused
    assert len(set(ran)) <= 2 and all(t.daemon for t in ran)  # one at a time: handed over, not started anew
    release = threading.Event()
    try:
        with pytest.raises(TransientError):
            within(lambda: release.wait(30), 0.2, "hung docker ps")
        assert within(lambda: 7, 5, "another") == 7  # not queued behind the hung one
    finally:
        release.set()
    until(lambda: not set(_io_threads()) - before, 10, "the idle threads to end")


def test_a_docker_engine_reads_no_proxy_settings_per_request(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A Docker socket or SSH channel takes no HTTP proxy; docker-py's requests.Session would read the
    environment's proxies and ~/.netrc on every request: a quarter of a listing's CPU (measured)."""
    import http.server
    import json
    import socketserver

    import requests

    from spark_supervisor.adapters.docker import LISTINGS, DockerEngine

    class Engine(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = json.dumps({"ApiVersion": "1.41", "Version": "20.10"} if "version" in self.path else [
                {"Id": "c" * 64, "Names": ["/ray"], "Image": "i", "State": "running", "Labels": {}, "ImageID": "s"}])
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *_: object) -> None:
            pass

    class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
        daemon_threads = True

    def read(*_: object, **__: object) -> None:
        raise AssertionError("the environment's proxy settings read for a Docker request")

    sock = tmp_path / "docker.sock"
    with Server(str(sock), Engine) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        engine = DockerEngine("spark-1", f"unix://{sock}", timeout=5)
        try:
            engine.client()  # docker-py's own start-up (its API version) is not ours to change
            monkeypatch.setattr(requests.sessions, "get_environ_proxies", read)
            monkeypatch.setattr(requests.sessions, "get_netrc_auth", read)
            LISTINGS.drop(engine.url)
            assert [c.name for c in engine.containers()] == ["ray"]
        finally:
            engine.reset()
            server.shutdown()
