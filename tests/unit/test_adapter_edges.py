"""The adapters at their edge, each with what it reads faked at the wire: the serve-state and `systemctl show`
parsers, the vLLM client (httpx.MockTransport, with the real server's captured answers), and the Docker
engine's listing (a fake docker-py API: the fields read, and the short-lived listing cache)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from spark_supervisor.adapters import AdapterError
from spark_supervisor.adapters.docker import LISTINGS, DockerEngine
from spark_supervisor.adapters.shell import Result
from spark_supervisor.adapters.vllm import VllmApi
from spark_supervisor.judge import completion
from spark_supervisor.model import EndpointState, Verdict
from spark_supervisor.specs import requests
from spark_supervisor.world.observe import _units, parse_serve_state
from tests.helpers import view_of

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "real_vllm"


# ------------------------------------------------------------------------------ the serve-state parser
def test_serve_state_running_exited_and_none() -> None:
    running = parse_serve_state("serve-state 4242 abc123def456 2026-12-04T14:00:00Z 1 \nINFO a line\nINFO another\n", "c1")
    assert (running.present, running.pid, running.running, running.exit_code, running.spec_hash) == (
        True, 4242, True, None, "abc123def456")
    assert running.container_id == "c1" and running.log_tail == "INFO a line\nINFO another\n"
    exited = parse_serve_state("serve-state 4242 abc123def456 2026-12-04T14:00:00Z 0 137\n", "c1")
    assert not exited.running and exited.exit_code == 137
    assert not parse_serve_state("serve-state 0  \n", "c1").present  # nothing recorded: no serve
    for lost in ("", "\n", "INFO a log line without the state line\n"):  # an exec's output lost or cut: unknown
        with pytest.raises(ValueError, match="no serve-state line"):
            parse_serve_state(lost, "c1")


# ----------------------------------------------------------------------------- `systemctl show`
def test_systemctl_show_blocks_are_units_and_a_failure_without_output_is_an_error() -> None:
    out = ("Id=vllm-cluster.service\nActiveState=active\nUnitFileState=enabled\nLoadState=loaded\n\n"
           "Id=vllm-proxy.service\nActiveState=inactive\nUnitFileState=disabled\nLoadState=not-found\n")
    units = _units(Result(0, out, ""))
    assert [(u.name, u.active, u.enabled, u.loaded) for u in units] == [
        ("vllm-cluster", "active", "enabled", "loaded"), ("vllm-proxy", "inactive", "disabled", "not-found")]
    assert _units(Result(1, out, "")) == units  # systemctl exits 1 for a unit not found, and still says it
    with pytest.raises(AdapterError, match="SystemctlFailed"):
        _units(Result(1, "", "Failed to connect to bus"))


# ----------------------------------------------------------------------------------- the vLLM client
def api(handler: Any) -> VllmApi:
    return VllmApi(httpx.Client(transport=httpx.MockTransport(handler)), "http://h:8000", api_key="k", timeout=2)


def test_the_client_reads_health_then_the_models_with_the_key() -> None:
    models = (FIXTURES / "models.json").read_bytes()
    seen: list[tuple[str, str | None]] = []

    def handler(r: httpx.Request) -> httpx.Response:
        seen.append((r.url.path, r.headers.get("authorization")))
        return httpx.Response(200, content=b"" if r.url.path == "/health" else models)
    ep = api(handler).observe()
    assert ep.state == EndpointState.UP and ep.health == 200 and ep.models == ("tiny-qwen3",)
    assert seen == [("/health", None), ("/v1/models", "Bearer k")]  # the key only where it is needed


@pytest.mark.parametrize("answer, state", [(lambda _: httpx.Response(401, json={"error": "Unauthorized"}), "error"),
                                           (lambda _: httpx.Response(200, content=b"not json"), "error")])
def test_a_models_answer_that_is_not_the_list_is_an_error_with_the_health_kept(answer: Any, state: str) -> None:
    def handler(r: httpx.Request) -> httpx.Response:
        return httpx.Response(200) if r.url.path == "/health" else answer(r)
    ep = api(handler).observe()
    assert ep.state == state and ep.health == 200 and ep.detail.startswith("/v1/models")


def test_a_refused_connection_is_refused_not_an_error() -> None:
    def handler(r: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=r)
    assert api(handler).observe_health().state == EndpointState.REFUSED


def sanity(client: VllmApi) -> Verdict:
    """A chat sanity request as the readiness probe sends it, judged as it judges it."""
    path, body = requests.sanity_request("chat", "tiny-qwen3", "hi", 16)
    return completion.judged("chat", client.sanity(path, body, 5, "serve-1"), "serve-1")


def test_the_sanity_request_is_judged_on_the_real_servers_answer() -> None:
    body = json.loads((FIXTURES / "completion.json").read_text())
    v = sanity(api(lambda _: httpx.Response(200, json=body)))
    assert v.passed and v.field == "reasoning" and v.serve == "serve-1"
    dead = (FIXTURES / "engine_death_response.txt").read_bytes()
    v = sanity(api(lambda _: httpx.Response(500, content=dead)))
    assert not v.passed and v.ran

    def slow(r: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=r)
    v = sanity(api(slow))
    assert not v.passed and "no answer within 5s" in v.why


# ------------------------------------------------------------------------------ the Docker engine's listing
class FakeApi:
    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows, self.calls = rows, 0

    def containers(self, all: bool = False) -> list[dict[str, Any]]:  # noqa: A002, ARG002 (docker-py's name, given as all=True)
        self.calls += 1
        return self.rows


class FakeClient:
    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.api = FakeApi(rows)


def test_the_listing_reads_names_states_labels_and_image_ids_and_is_shared_for_a_moment() -> None:
    rows: list[dict[str, Any]] = [{"Id": "0123456789abcdef", "Names": ["/qwen-ray-spark-1"], "Image": "vllm/vllm-openai:latest",
             "ImageID": "sha256:" + "a" * 64, "State": "running", "Labels": {"spark-supervisor.owner": "qwen"}},
            {"Id": "fedcba9876543210", "Names": None, "Image": "busybox", "State": "exited", "Labels": None}]
    engine = DockerEngine("spark-1", "unix:///tmp/edge-test.sock", timeout=5)
    fake = FakeClient(rows)
    engine._client = fake  # docker-py's client, faked at its API
    LISTINGS.drop(engine.url)
    try:
        found = engine.containers()
        assert [(c.id, c.name, c.image, c.image_id, c.state, c.labels) for c in found] == [
            ("0123456789ab", "qwen-ray-spark-1", "vllm/vllm-openai:latest", "sha256:" + "a" * 64, "running",
             {"spark-supervisor.owner": "qwen"}),
            ("fedcba987654", "?", "busybox", "", "exited", {})]
        assert engine.containers() == found and fake.api.calls == 1  # one listing serves the same pass
        LISTINGS.drop(engine.url)  # what this process changes drops it at once
        engine.containers()
        assert fake.api.calls == 2
    finally:
        LISTINGS.drop(engine.url)


def test_an_ssh_engines_transport_wakes_once_in_5_seconds_not_ten_times_a_second() -> None:
    """docker-py's ssh:// engines go through paramiko, whose transport thread polls its socket on this timeout
    for as long as the connection lives; the daemon sets it (adapters/docker.py) and a paramiko that no longer
    reads it would bring back ten wakes a second per engine."""
    import socket

    import paramiko

    a, b = socket.socketpair()
    try:
        t = paramiko.Transport(a)
        assert t.sock.gettimeout() == 5.0
        t.close()
    finally:
        a.close()
        b.close()


def test_the_ticks_http_client_drops_a_kept_connection_before_the_server_closes_it() -> None:
    """vLLM's uvicorn closes a kept connection after 5 s idle (the stand-in does as it does): a request sent on
    one as it closes fails, and would read as a failed probe. The tick's client lets go of it well before."""
    from spark_supervisor.world.observe import World
    from spark_testbed.vllm_standin import Api
    from tests.helpers import cfg

    assert World.KEEP_ALIVE_S < Api.KEEP_ALIVE_S - 1
    w = World(view_of(cfg()))
    try:
        assert w.http._transport._pool._keepalive_expiry == World.KEEP_ALIVE_S  # type: ignore[attr-defined]
    finally:
        w.close()
