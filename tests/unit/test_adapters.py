"""Adapter building blocks that need no peer: the hard deadline every Docker call runs under."""

import contextlib
import http.server
import json
import socketserver
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spark_supervisor.adapters import TransientError, within
from spark_supervisor.adapters.docker import DockerEngine


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


class _EngineHandler(http.server.BaseHTTPRequestHandler):
    """A Docker engine's HTTP API on a unix socket, as far as a test needs it: GET answers ``get(path)``, POST
    records its path in ``posted`` and answers one line of a pull's progress."""

    get: Callable[[str], object] = staticmethod(lambda _path: {"ApiVersion": "1.41", "Version": "20.10"})
    posted: list[str] = []

    def do_GET(self) -> None:  # noqa: N802
        self._answer(json.dumps(self.get(self.path)))

    def do_POST(self) -> None:  # noqa: N802
        self.posted.append(self.path)
        self._answer('{"status": "Pulling fs layer", "id": "l1", "progressDetail": {}}\n')

    def _answer(self, body: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *_: object) -> None:
        pass


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


@contextlib.contextmanager
def fake_engine(sock: Path, handler: type[_EngineHandler]) -> Iterator[DockerEngine]:
    """A DockerEngine of the adapter, on a fake engine served at ``sock`` by ``handler``."""
    with _UnixServer(str(sock), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        engine = DockerEngine("spark-1", f"unix://{sock}", timeout=5)
        try:
            yield engine
        finally:
            engine.reset()
            server.shutdown()


def test_a_docker_engine_reads_no_proxy_settings_per_request(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A Docker socket or SSH channel takes no HTTP proxy; docker-py's requests.Session would read the
    environment's proxies and ~/.netrc on every request: a quarter of a listing's CPU (measured)."""
    import requests

    from spark_supervisor.adapters.docker import LISTINGS

    class Engine(_EngineHandler):
        get = staticmethod(lambda path: {"ApiVersion": "1.41", "Version": "20.10"} if "version" in path else [
            {"Id": "c" * 64, "Names": ["/ray"], "Image": "i", "State": "running", "Labels": {}, "ImageID": "s"}])

    def read(*_: object, **__: object) -> None:
        raise AssertionError("the environment's proxy settings read for a Docker request")

    with fake_engine(tmp_path / "docker.sock", Engine) as engine:
        engine.client()  # docker-py's own start-up (its API version) is not ours to change
        monkeypatch.setattr(requests.sessions, "get_environ_proxies", read)
        monkeypatch.setattr(requests.sessions, "get_netrc_auth", read)
        LISTINGS.drop(engine.url)
        assert [c.name for c in engine.containers()] == ["ray"]


@pytest.mark.parametrize(("image", "from_image", "tag"), [
    ("vllm/vllm-openai:v0.19.1", "vllm/vllm-openai", "v0.19.1"),
    ("registry.local:5000/spark/vllm", "registry.local:5000/spark/vllm", "latest"),
    ("registry.local:5000/spark/vllm:0.34", "registry.local:5000/spark/vllm", "0.34"),
    ("nvcr.io/nvidia/vllm@sha256:" + "a" * 64, "nvcr.io/nvidia/vllm", "sha256:" + "a" * 64),
])
def test_a_pull_asks_the_engine_for_the_reference_as_docker_reads_it(tmp_path: Path, image: str, from_image: str,
                                                                      tag: str) -> None:
    """Issue 42, item 6: the reference is parsed by docker-py, as the docker CLI does (a registry's port is no
    tag, a digest is pulled by digest); the request the engine receives is what is checked."""
    import urllib.parse

    class Engine(_EngineHandler):
        posted: list[str] = []

    with fake_engine(tmp_path / "docker.sock", Engine) as engine:
        engine.pull(image, timeout=10)
    asked = [urllib.parse.parse_qs(urllib.parse.urlsplit(p).query) for p in Engine.posted]
    assert asked == [{"fromImage": [from_image], "tag": [tag]}]


@pytest.mark.parametrize("image", ["sha256:" + "b" * 64, "b" * 64, "0123456789ab"])
def test_an_image_id_is_never_pulled(image: str) -> None:
    from spark_supervisor.adapters import ImageMissingError
    from spark_supervisor.adapters.docker import DockerEngine, is_image_id
    assert is_image_id(image) and not is_image_id("vllm/vllm-openai:latest") and not is_image_id("abc")
    engine = DockerEngine("spark-1", "unix:///nonexistent/docker.sock", timeout=1)
    with pytest.raises(ImageMissingError, match="PinnedImageGone"):
        engine.pull(image, timeout=1)  # refused before any connection: the socket does not exist
