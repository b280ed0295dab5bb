"""A followed engine's container events decide when a steady sweep may keep its listing (adapters/docker.py):
docker-py against an engine faked at its HTTP API on a unix socket (the real engines: the integration tests)."""

from __future__ import annotations

import http.server
import json
import queue
import socketserver
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_supervisor.adapters.docker import LISTINGS, DockerEngine
from spark_supervisor.config import OWNER_LABEL
from spark_testbed.testbed import until


class FakeEngine:
    """/version, /containers/json (counted) and /events: a chunked stream the test writes to (None ends it)."""

    def __init__(self, sock: Path) -> None:
        self.listings, self.streams = 0, 0
        self.events: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self.filters: list[str] = []
        self.refuse = threading.Event()
        engine = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802
                if "/events" in self.path:
                    return self.stream()
                if "/containers/json" in self.path:
                    engine.listings += 1
                    body: object = [{"Id": "c" * 64, "Names": ["/ray"], "Image": "i", "State": "running",
                                     "Labels": {}, "ImageID": "s"}]
                else:
                    body = {"ApiVersion": "1.41", "Version": "20.10"}
                raw = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def stream(self) -> None:
                engine.filters.append(self.path)
                engine.streams += 1
                if engine.refuse.is_set():  # an engine that cannot follow now (restarting)
                    raw = b'{"message": "restarting"}'
                    self.send_response(500)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(raw)))
                    self.end_headers()
                    self.wfile.write(raw)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                while (ev := engine.events.get()) is not None:
                    data = json.dumps(ev).encode() + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.close_connection = True

            def log_message(self, *_: object) -> None:
                pass

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self.server = Server(str(sock), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.events.put(None)  # a stream still open ends
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def followed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FakeEngine, DockerEngine]]:
    monkeypatch.setattr(LISTINGS, "TTL_S", 0.0)  # no sharing within a pass: every listing here is asked for
    fake = FakeEngine(tmp_path / "docker.sock")
    engine = DockerEngine("spark-1", f"unix://{tmp_path / 'docker.sock'}", timeout=5, follow=True)
    try:
        yield fake, engine
    finally:
        follower = LISTINGS.followers.get(engine.url)
        engine.close()
        fake.close()
        if follower is not None:
            follower.thread.join(10)
            assert not follower.thread.is_alive(), "the follower outlived its engine's close"


def live(engine: DockerEngine) -> Callable[[], bool]:
    return lambda: LISTINGS.generation(engine.url) >= 0


def follow(engine: DockerEngine) -> None:
    """The first steady sweep starts following the engine's events (none before it: a start has no steady sweep)."""
    assert engine.url not in LISTINGS.followers
    engine.containers()
    assert engine.url not in LISTINGS.followers, "a full observation's listing started following"
    engine.containers(trusted=True)
    until(live(engine), 10, "the event stream open")


def test_a_steady_sweep_keeps_its_listing_until_the_engine_tells_of_a_change(
        followed: tuple[FakeEngine, DockerEngine]) -> None:
    fake, engine = followed
    follow(engine)
    assert fake.filters and "die" in fake.filters[0] and "exec_start" not in fake.filters[0]  # changes, exec ends
    assert [c.name for c in engine.containers(trusted=True)] == ["ray"]
    n = fake.listings
    engine.containers(trusted=True)
    engine.containers(trusted=True)
    assert fake.listings == n, "a steady sweep listed again though nothing changed"
    engine.containers()  # a full observation (not trusted) lists afresh, whatever the stream says
    assert fake.listings == n + 1
    gen = LISTINGS.generation(engine.url)
    fake.events.put({"Type": "container", "Action": "die", "id": "c" * 64})
    until(lambda: LISTINGS.generation(engine.url) != gen, 10, "the event taken in")
    engine.containers(trusted=True)
    assert fake.listings == n + 2, "a change told by the engine did not make the next sweep list"
    engine.containers(trusted=True)
    assert fake.listings == n + 2


def exec_ended(exec_id: str, ours: bool = True) -> dict[str, Any]:
    """An exec_die as the engine tells it: the container's labels among the attributes (moby's
    LogContainerEventWithAttributes), with the exec's ID and exit code."""
    labels = {OWNER_LABEL: "spark-supervisor"} if ours else {}
    return {"Type": "container", "Action": "exec_die", "status": "exec_die", "id": "c" * 64,
            "Actor": {"ID": "c" * 64, "Attributes": {"execID": exec_id, "exitCode": "137", "name": "ray", **labels}}}


def test_an_exec_that_ends_in_a_container_of_ours_is_a_cue_and_changes_no_listing(
        followed: tuple[FakeEngine, DockerEngine]) -> None:
    """A serve's wrapper is a detached exec: its end cues the daemon's quick checks. One this process waited on (it
    reads its end itself) is no cue, nor one in a container not ours; none moves the listing's generation."""
    fake, engine = followed
    cues: list[int] = []
    stop = LISTINGS.listen(lambda: cues.append(1))
    try:
        follow(engine)
        assert "exec_die" in fake.filters[0]
        gen = LISTINGS.generation(engine.url)
        LISTINGS.await_exec("a" * 64)
        fake.events.put(exec_ended("a" * 64))
        fake.events.put(exec_ended("b" * 64, ours=False))
        fake.events.put(exec_ended("d" * 64))
        fake.events.put({"Type": "container", "Action": "die", "id": "c" * 64})  # taken in after the three
        until(lambda: LISTINGS.generation(engine.url) != gen, 10, "the events taken in")
        assert LISTINGS.generation(engine.url) == gen + 1, "an exec's end moved the listing's generation"
        assert cues == [1]
    finally:
        stop()
    fake.events.put(exec_ended("e" * 64))
    fake.events.put({"Type": "container", "Action": "die", "id": "c" * 64})
    until(lambda: LISTINGS.generation(engine.url) == gen + 2, 10, "the events taken in")
    assert cues == [1], "a cue after its listener stopped"


def test_a_silent_stream_is_believed_no_longer_than_its_bound(
        followed: tuple[FakeEngine, DockerEngine], monkeypatch: pytest.MonkeyPatch) -> None:
    fake, engine = followed
    follow(engine)
    engine.containers(trusted=True)
    monkeypatch.setattr(LISTINGS, "TRUST_S", 0.0)
    n = fake.listings
    engine.containers(trusted=True)
    assert fake.listings == n + 1


def test_an_ended_stream_is_unknown_every_sweep_lists_until_it_is_back(
        followed: tuple[FakeEngine, DockerEngine]) -> None:
    fake, engine = followed
    follow(engine)
    engine.containers(trusted=True)
    fake.refuse.set()
    fake.events.put(None)  # the engine ends the stream and refuses a new one (a restart, a dropped SSH channel)
    until(lambda: not live(engine)(), 10, "the end of the stream seen")
    n = fake.listings
    engine.containers(trusted=True)
    engine.containers(trusted=True)
    assert fake.listings == n + 2, "a listing kept while nothing could tell of a change"
    streams = fake.streams
    until(lambda: fake.streams > streams, 10, "a reconnect tried, and refused")
    assert not live(engine)()
    fake.refuse.clear()
    until(live(engine), 30, "the stream followed again")
    engine.containers(trusted=True)
    n = fake.listings
    engine.containers(trusted=True)
    assert fake.listings == n, "the stream back, a steady sweep keeps its listing again"


def test_the_engines_of_one_url_share_one_follower_which_ends_with_the_last(tmp_path: Path) -> None:
    fake = FakeEngine(tmp_path / "docker.sock")
    url = f"unix://{tmp_path / 'docker.sock'}"
    a = DockerEngine("spark-1", url, timeout=5, follow=True)
    b = DockerEngine("spark-1", url, timeout=5, follow=True)
    try:
        follow(a)
        b.containers(trusted=True)
        follower = LISTINGS.followers[url]
        assert fake.streams == 1
        a.close()
        assert LISTINGS.followers.get(url) is follower and follower.thread.is_alive()
        b.close()
        assert url not in LISTINGS.followers
        follower.thread.join(10)
        assert not follower.thread.is_alive()
        assert LISTINGS.generation(url) == -1
    finally:
        a.close()
        b.close()
        fake.close()
