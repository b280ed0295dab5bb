"""Seen on a busy machine (issue 19): an exited container says why, a port someone else holds is a
deterministic PortInUse naming the port and its holder, found before the containers start where it can be."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any, cast

import pytest
from pydantic import SecretStr

from spark_supervisor.adapters import AdapterError
from spark_supervisor.adapters.listening import parse_listening
from spark_supervisor.judge import logscan
from spark_supervisor.model import Listener, Observation, Phase, Reason, StartContainer, Status
from spark_supervisor.plan import plan
from spark_supervisor.world.observe import NodeAdapters, _ended
from tests.helpers import cfg, data, images, node_obs, obs, ray_container, view_of

C = cfg()
HEAD_IP = "192.168.200.12"
RAY_GCS = ("[2026-12-03 20:01:34,731 C 20309 20309] (gcs_server) grpc_server.cc:134:  An unexpected system state has "
           "occurred. Check failed: server_ Failed to start the grpc server. The specified port is 6379. This means "
           "that Ray's core components will not be able to function correctly. If the server startup error message "
           "is `Address already in use`, it indicates the server fails to start because the port is already used")
RAY_TAIL = "Local node IP: 192.168.200.12\nTraceback (most recent call last):\n" + \
    "RuntimeError: Failed to start GCS.  Last 1 lines of error files:\n" + RAY_GCS + "\n"


# ---------------------------------------------------------------------------------------- the log line
@pytest.mark.parametrize("line, port", [
    (RAY_GCS, 6379),
    ("ERROR:    [Errno 98] error while attempting to bind on address ('192.168.200.12', 8000): address already in use", 8000),
    ("OSError: [Errno 98] Address already in use", None),
    ("bind 192.168.200.12:8265 failed: Address already in use", 8265),
    ("ValueError: port 10001 is already in use", 10001),
    ("grpc: Failed to bind to address 0.0.0.0:6379", 6379),
])
def test_a_bind_that_failed_is_port_in_use_with_its_port(line: str, port: int | None) -> None:
    found = logscan.port_in_use(f"INFO starting\n{line}\nINFO the rest\n")
    assert found is not None and found.port == port and found.line and found.line in line
    failure = logscan.classify(line)
    assert failure is not None and failure.reason in ("PortInUse", "MasterPortInUse")


@pytest.mark.parametrize("text", ["", "INFO transport 5 started", "Ray runtime started.", "support 6379 nodes"])
def test_other_lines_are_not_port_in_use(text: str) -> None:
    assert logscan.port_in_use(text) is None


def test_a_serve_that_could_not_bind_is_deterministic() -> None:
    f = logscan.classify("ERROR: [Errno 98] error while attempting to bind on address ('0.0.0.0', 8000): "
                         "address already in use")
    assert f is not None and f.reason == "PortInUse" and f.deterministic


# ------------------------------------------------------------------------------------- the listeners
SS = """LISTEN 0      4096   192.168.200.12:6379  0.0.0.0:*    users:(("redis-server",pid=42,fd=6))
LISTEN 0      128          0.0.0.0:22    0.0.0.0:*    users:(("sshd",pid=7,fd=3),("sshd",pid=8,fd=3))
LISTEN 0      128             [::]:8000     [::]:*
LISTEN 0      128                *:10001       *:*    users:(("python3",pid=99,fd=4))
LISTEN 0      128   127.0.0.53%lo:53  0.0.0.0:*
LISTEN 0      128   [::ffff:192.168.200.12]:8265 [::]:*
"""
PROC = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0C00A8C0:18EB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 0100007F:1F90 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 20 4 30 10 -1
  sl  local_address                         remote_address                        st
   0: 00000000000000000000000000000000:1F40 00000000000000000000000000000000:0000 0A 00000000:00000000 00:0 0 0
"""


def test_ss_lines_are_read_with_their_process() -> None:
    got = parse_listening(SS)
    assert got[0] == Listener(HEAD_IP, 6379, "redis-server", 42)
    assert got[1] == Listener("0.0.0.0", 22, "sshd", 7)
    assert (got[2].address, got[2].port, got[2].everywhere) == ("::", 8000, True)
    assert (got[3].address, got[3].everywhere, got[3].pid) == ("*", True, 99)
    assert (got[4].address, got[4].port) == ("127.0.0.53", 53)
    assert (got[5].address, got[5].port) == (f"::ffff:{HEAD_IP}", 8265)


def test_the_kernels_tables_are_read_listeners_only() -> None:
    got = parse_listening(PROC)
    # 192.168.0.12 (0C00A8C0 little-endian) :6379 LISTEN; the connection in state 01 is no listener
    assert got == (Listener("192.168.0.12", 6379), Listener("::", 8000))


@pytest.mark.parametrize("out", ["garbage here", "LISTEN 0 1 nocolon x", "   0: zz:18EB 00000000:0000 0A x"])
def test_an_unreadable_line_makes_the_reading_unknown_not_free(out: str) -> None:
    with pytest.raises(AdapterError):
        parse_listening(out)


# -------------------------------------------------------------------------------- before the start
def cold(**listening: tuple[Listener, ...] | None) -> tuple[Observation, Status]:
    nodes = {n.name: node_obs(n.name, listening=listening.get(n.name.replace("-", "_"), ())) for n in C.nodes}
    st = Status(images=images(C))
    st.advance(Phase.DETECTING, Reason(), 0, 0)
    return obs(C, nodes=nodes), st


def test_nothing_in_the_way_starts_the_containers() -> None:
    o, st = cold(spark_1=(Listener("127.0.0.1", 6379, "redis-server", 42), Listener("0.0.0.0", 22, "sshd", 7)),
                 spark_2=(Listener(HEAD_IP, 6379, "x", 1),))  # another address, another node: not in the way
    d = plan(o, st, view_of(C), 1)
    assert d.phase == Phase.STARTING_RAY and any(isinstance(a, StartContainer) for a in d.actions), d


@pytest.mark.parametrize("holder, needle", [
    (Listener(HEAD_IP, 6379, "redis-server", 42), "spark-1: 6379 (Ray's GCS) held by redis-server (pid 42)"),
    (Listener("*", 6379), "spark-1: 6379 (Ray's GCS) held by a process the node does not name"),
    (Listener("::", 8265, "nginx", 5), "spark-1: 8265 (Ray's dashboard) held by nginx (pid 5)"),
    (Listener("0.0.0.0", 10001, "python3", 9), "spark-1: 10001 (Ray's client server)"),
    (Listener(HEAD_IP, 8000, "python3", 9), "spark-1: 8000 (the serve (Qwen3.5))"),
])
def test_a_port_held_on_the_fabric_ip_or_everywhere_is_failed_before_anything_starts(holder: Listener, needle: str) -> None:
    o, st = cold(spark_1=(holder,))
    d = plan(o, st, view_of(C), 1)
    assert d.phase == Phase.FAILED and d.fatal and not d.repair and not d.actions
    assert d.why.kind == "PortInUse" and needle in d.reason, d.reason


def test_listeners_that_could_not_be_read_hold_the_start() -> None:
    o, st = cold(spark_2=None)
    d = plan(o, st, view_of(C), 1)
    assert not d.actions and not d.fatal and d.why.kind == "ObservationUnknown"
    assert "spark-2: listening ports not read" in d.reason


# --------------------------------------------------------------------------- an exited container says why
def deployed(head: dict[str, Any], listening: tuple[Listener, ...] = ()) -> tuple[Observation, Status]:
    nodes = {"spark-1": node_obs("spark-1", (replace(ray_container(C, "spark-1"), **head),), listening=listening),
             "spark-2": node_obs("spark-2", (ray_container(C, "spark-2"),))}
    st = Status(images=images(C))
    st.advance(Phase.STARTING_RAY, Reason(), 0, 0)
    return obs(C, nodes=nodes), st


def test_a_ray_head_that_could_not_bind_is_port_in_use_not_a_gang_restart() -> None:
    o, st = deployed({"state": "exited", "exit_code": 1, "log_tail": RAY_TAIL},
                     (Listener("0.0.0.0", 6379, "redis-server", 42),))
    d = plan(o, st, view_of(C), 5)
    assert d.phase == Phase.FAILED and d.fatal and not d.repair
    assert d.reason.startswith("PortInUse: spark-1: Ray container exited: 6379 held by redis-server (pid 42)")
    assert "The specified port is 6379" in d.reason


def test_a_partial_observation_looks_closer_for_the_holder_before_failing() -> None:
    o, st = deployed({"state": "exited", "exit_code": 1, "log_tail": RAY_TAIL})
    d = plan(replace(o, full=False), st, view_of(C), 5)
    assert d.look_closer and not d.fatal and not d.repair and not d.actions and d.why.kind == "PortInUse"


def test_a_container_that_exited_otherwise_says_its_code_and_last_line() -> None:
    o, st = deployed({"state": "exited", "exit_code": 137, "log_tail": "starting\nKilled by a signal\n"})
    d = plan(o, st, view_of(C), 5)
    assert d.repair == "gang"
    assert d.reason == "PartialDeployment: spark-1: Ray container exited (exit code 137: Killed by a signal)"


class Engine:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def ended(self, _name: str) -> tuple[int | None, str]:
        if self.fail:
            raise AdapterError("DockerTimeout", "no answer")
        return 1, "VLLM_API_KEY=sk-the-api-key-0123\nRuntimeError: Failed to start GCS.\n"


def adapters(engine: Engine) -> NodeAdapters:
    """A node's adapters, of which _ended reads only the engine."""
    return cast(NodeAdapters, SimpleNamespace(docker=engine))


def test_the_observation_reads_why_an_owned_container_ended_redacted() -> None:
    c = C.model_copy()
    c.deployment.readiness._api_key = SecretStr("sk-the-api-key-0123")
    exited = replace(ray_container(C, "spark-1"), state="exited")
    running = ray_container(C, "spark-2")
    stranger = replace(exited, name="other", labels={})
    [a, b, s] = _ended(adapters(Engine()), view_of(c), (exited, running, stranger))
    assert a.exit_code == 1 and "Failed to start GCS" in a.log_tail and "sk-the-api-key-0123" not in a.log_tail
    assert b == running and s == stranger  # only the deployment's exited containers are asked about
    [a] = _ended(adapters(Engine(fail=True)), view_of(c), (exited,))
    assert a == exited  # could not be read: still exited, why unknown


def test_the_ports_needed_are_read_from_the_config() -> None:
    from spark_supervisor.judge.admission import ports_needed
    d = data()
    d["deployments"][0]["ray"] = {"port": 6380, "dashboard_port": 8266, "extra_args": ["--ray-client-server-port", "10002"]}
    d["deployments"][0]["serve"]["port"] = 8100
    assert ports_needed(view_of(cfg(d))) == {
        "spark-1": {6380: "Ray's GCS", 8266: "Ray's dashboard", 10002: "Ray's client server", 8100: "the serve (Qwen3.5)"},
        "spark-2": {}}
    assert 8266 not in ports_needed(view_of(cfg(d)), dashboard=False)["spark-1"]
    d["deployments"][0]["serve"].update(distributed_executor_backend="mp", master_port=29600)
    mp = cfg(d)
    assert ports_needed(view_of(mp)) == {"spark-1": {8100: "the serve (Qwen3.5)",
                                                           29600: "the serve's rank 0 (master_port)"}, "spark-2": {}}
