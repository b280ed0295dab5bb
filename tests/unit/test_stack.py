"""Several deployments: the config's checks across them, the one owner rule, and the daemon stepping one
reconciler per deployment (fake backends, fake clock): start order, READY, repairs and reloads that touch
only their own deployment."""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import structlog
import tomli_w

from spark_supervisor import config
from spark_supervisor.config.view import DeploymentView
from spark_supervisor.loop.daemon import Daemon
from spark_supervisor.model import (
    CheckImage,
    Container,
    EndpointObservation,
    EndpointState,
    Phase,
    RemoveContainers,
    StartContainer,
    StartServe,
    Status,
    StopServe,
)
from spark_supervisor.plan import Facts, hygiene
from tests.fakes import Clock, FakeBackend, Notes, prove_inline
from tests.helpers import cfg, data, images, node_obs, obs, phase_now, serve_running, with_image

EMBED: dict[str, Any] = {"name": "embed", "nodes": ["spark-2"], "after": ["qwen"],
         "serve": {"model": "BAAI/bge-m3", "distributed_executor_backend": "mp", "tensor_parallel_size": 1,
                   "gpu_memory_utilization": 0.1, "port": 8001}}


def stack(*more: dict[str, Any], **patch: Any) -> dict[str, Any]:
    """The two-Spark LLM (0.85 of each GPU by default) plus `more` deployments."""
    d = data(**patch)
    d["deployments"][0]["serve"]["gpu_memory_utilization"] = 0.8
    d["deployments"] += [copy.deepcopy(m) for m in more]
    return d


def problems(d: dict[str, Any]) -> list[str]:
    with pytest.raises(config.ConfigError) as e:
        config.parse(with_image(d), "/etc/spark-supervisor/x.toml", env={})
    return e.value.problems


# ------------------------------------------------------------------------------------------------ config
def test_a_stack_of_an_llm_on_both_sparks_and_a_single_node_model_on_the_worker_is_valid() -> None:
    c = cfg(stack(EMBED))
    assert [d.name for d in c.deployments] == ["qwen", "embed"]
    v = c.view(c.deployments[1])
    assert [n.name for n in v.nodes] == ["spark-2"] and v.serve_node(v.deployment).name == "spark-2"
    assert v.supervisor.state_dir == "/tmp/x/deployments/embed" and v.owners == {"qwen", "embed"}
    assert v.endpoint(v.deployment) == "http://192.168.200.13:8001"


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["deployments"][1].update(after=["nope"]), "deployments[1].after[0]: 'nope' is not another deployment"),
    (lambda d: d["deployments"][1].update(after=["embed"]), "deployments[1].after[0]: 'embed' is not another"),
    (lambda d: d["deployments"][0].update(after=["embed"]), "deployments: the start order goes round in a circle: "
                                                            "qwen -> embed -> qwen"),
    (lambda d: d["deployments"][1]["serve"].update(gpu_memory_utilization=0.3),
     "deployments[1].serve.gpu_memory_utilization: the deployments on spark-2 ask for 1.10 of its GPU memory "
     "(qwen 0.8, embed 0.3), more than 0.95"),
    (lambda d: d["deployments"][1].update(nodes=["spark-1"]) or d["deployments"][1]["serve"].update(port=8000),
     "deployments[1].serve.port: port 8000 is also deployments[0].serve.port on spark-1"),
    (lambda d: d["deployments"][1]["serve"].update(tensor_parallel_size=2),
     "deployments[1].serve.tensor_parallel_size: TP x PP = 2 is larger than the 1 GPUs"),
])
def test_each_stack_mistake_names_the_file_and_key(mutate: Callable[[dict[str, Any]], None], expected: str) -> None:
    d = stack(EMBED)
    mutate(d)
    found = problems(d)
    assert any(p.startswith(f"/etc/spark-supervisor/x.toml: {expected}") for p in found), found


def test_the_same_port_on_different_nodes_is_no_clash() -> None:
    d = stack({**EMBED, "serve": {**EMBED["serve"], "port": 8000}})
    assert cfg(d).deployments[1].serve.port == 8000


# ------------------------------------------------------------------------------------------- owner rule
def test_hygiene_never_takes_another_configured_deployments_container_for_an_orphan() -> None:
    c = cfg(stack(EMBED))
    v = DeploymentView.build(c, c.deployments[0])
    embeds = Container("e1", "embed-vllm-spark-2", "img", "exited", {config.OWNER_LABEL: "embed"})
    gone = Container("g1", "old-vllm-spark-2", "img", "running", {config.OWNER_LABEL: "old"})
    o = obs(v.cfg, nodes={"spark-1": node_obs("spark-1"), "spark-2": node_obs("spark-2", (embeds, gone))})
    d = hygiene(Facts(o, Status(), v, 0.0))
    assert d is not None and d.actions == (RemoveContainers("spark-2", ("old-vllm-spark-2",), "orphan"),)
    assert d.why.kind == "StaleFound" and "embed" not in d.reason


# ----------------------------------------------------------------------------------------------- daemon
def make(tmp_path: Path, d: dict[str, Any]) -> tuple[Daemon, dict[str, FakeBackend], Clock, Notes, Path]:
    d["supervisor"]["state_dir"] = str(tmp_path / "state")
    path = tmp_path / "c.toml"
    path.write_text(tomli_w.dumps(with_image(d)))
    backends: dict[str, FakeBackend] = {}
    clock, notes = Clock(), Notes()

    def factory(view: DeploymentView) -> FakeBackend:
        be = backends[view.name] = FakeBackend()
        be.reports = images(view.cfg)
        return be
    daemon = Daemon(str(path), cfg(d), log=structlog.get_logger(), backend_factory=factory, notifier=notes,
                    clock=clock, wall=lambda: 1.7e9 + clock.t, rng=lambda: 1.0, prove=prove_inline)
    for r in daemon.reconcilers.values():
        r.status.images = images(r.view.cfg)
    return daemon, backends, clock, notes, path


def serving(daemon: Daemon, be: dict[str, FakeBackend], name: str) -> None:
    """What a serving deployment looks like to its own backend."""
    v = daemon.reconcilers[name].view.cfg
    be[name].next = obs(v, deployed=True, serve=serve_running(v),
                        endpoint=EndpointObservation(EndpointState.UP, health=200, models=(v.deployment.serve.name,)))


def ticks_until(daemon: Daemon, done: Any, most: int = 6) -> None:
    for _ in range(most):
        if done():
            return
        daemon.tick()
    assert done()


def test_a_deployment_waits_for_the_ones_it_starts_after_then_starts(tmp_path: Path) -> None:
    daemon, be, clock, notes, _ = make(tmp_path, stack(EMBED))
    q, e = daemon.reconcilers["qwen"], daemon.reconcilers["embed"]
    be["qwen"].next, be["embed"].next = obs(q.view.cfg), obs(e.view.cfg)
    daemon.tick()
    assert e.status.phase == Phase.WAITING and e.status.why.kind == "WaitingFor" and "qwen (STARTING_RAY)" in e.status.reason
    assert be["embed"].ran == [] and StartContainer("spark-1") in be["qwen"].ran
    assert "0/2 serving; embed WAITING" in daemon.status_line() or "0/2 serving; qwen" in daemon.status_line()
    serving(daemon, be, "qwen")
    ticks_until(daemon, lambda: q.status.phase in (Phase.VERIFYING, Phase.SERVING))
    # qwen answers (its memory profiling is over): embed starts in the same pass, not an interval later
    assert be["embed"].ran == [StartContainer("spark-2")] and phase_now(e.status) == Phase.STARTING_RAY
    assert not any(n.startswith("READY=1") for n in notes.sent)  # embed is required too
    serving(daemon, be, "embed")
    ticks_until(daemon, lambda: phase_now(e.status) == Phase.SERVING and phase_now(q.status) == Phase.SERVING)
    assert daemon.status_line() == "SERVING 2/2 deployments" and daemon.status_line() == "SERVING 2/2 deployments"
    assert sum(n.startswith("READY=1") for n in notes.sent) == 1


def test_ready_does_not_wait_for_a_deployment_that_is_not_required(tmp_path: Path) -> None:
    daemon, be, clock, notes, _ = make(tmp_path, stack({**EMBED, "required": False, "after": []}))
    serving(daemon, be, "qwen")
    be["embed"].next = obs(daemon.reconcilers["embed"].view.cfg)
    ticks_until(daemon, lambda: daemon.reconcilers["qwen"].status.phase == Phase.SERVING)
    assert daemon.reconcilers["embed"].status.phase != Phase.SERVING
    assert sum(n.startswith("READY=1") for n in notes.sent) == 1


def test_a_repair_of_one_deployment_acts_on_nothing_of_the_other(tmp_path: Path) -> None:
    daemon, be, clock, notes, _ = make(tmp_path, stack({**EMBED, "after": []}))
    serving(daemon, be, "qwen")
    serving(daemon, be, "embed")
    ticks_until(daemon, lambda: daemon.status_line() == "SERVING 2/2 deployments")
    be["qwen"].ran.clear()
    be["embed"].ran.clear()
    v = daemon.reconcilers["qwen"].view.cfg
    dead = serve_running(v)
    be["qwen"].next = obs(v, deployed=True, serve=type(dead)(**{**dead.__dict__, "running": False, "exit_code": 1}),
                          endpoint=EndpointObservation(EndpointState.REFUSED))
    clock.t += 5
    daemon.tick()
    assert daemon.reconcilers["qwen"].status.phase != Phase.SERVING and be["qwen"].ran
    assert be["embed"].ran == [] and daemon.reconcilers["embed"].status.phase == Phase.SERVING
    assert daemon.status_line().startswith("1/2 serving; qwen ")
    # ping answers for the stack, not for whichever deployment comes first in the file
    assert daemon._on_request("ping") == f"spark-supervisor {os.getpid()}: {daemon.status_line()}"
    assert daemon.reconcilers["qwen"].repairs.entries and not daemon.reconcilers["embed"].repairs.entries


def test_a_reload_tears_down_only_the_deployment_removed_and_starts_the_one_added(tmp_path: Path) -> None:
    d = stack({**EMBED, "after": []})
    daemon, be, clock, notes, path = make(tmp_path, d)
    serving(daemon, be, "qwen")
    serving(daemon, be, "embed")
    ticks_until(daemon, lambda: daemon.status_line() == "SERVING 2/2 deployments")
    qwen_backend, qwen = be["qwen"], daemon.reconcilers["qwen"]
    torn: list[str] = []
    def teardown() -> list[str]:
        torn.append("embed")
        return ["spark-2/embed-vllm-spark-2"]
    be["embed"].teardown = teardown  # type: ignore[method-assign]  # a fake's method replaced for one test
    d2 = copy.deepcopy(d)
    d2["deployments"][1] = {**EMBED, "name": "rerank", "after": [], "serve": {**EMBED["serve"], "port": 8002}}
    path.write_text(tomli_w.dumps(with_image(d2)))
    daemon.reload()
    assert torn == [] and daemon.reloader.staged is not None  # a removal waits for the file to read the same again
    clock.t += daemon.SETTLE_S
    daemon.tick()
    assert torn == ["embed"] and be["embed"].closed
    assert list(daemon.reconcilers) == ["qwen", "rerank"]
    assert daemon.reconcilers["qwen"] is qwen and qwen.backend is qwen_backend and not qwen_backend.closed
    assert qwen.status.phase == Phase.SERVING  # untouched: its view did not change
    be["rerank"].next = obs(daemon.reconcilers["rerank"].view.cfg)
    daemon.tick()
    assert be["rerank"].ran == [CheckImage("spark-2", model_later=True), StartContainer("spark-2")]  # a new deployment checks its image
    assert not any(isinstance(a, StopServe | StartServe | RemoveContainers) for a in qwen_backend.ran[-3:])


# -------------------------------------------------------------------------------------- shared GPUs
@pytest.mark.parametrize("owned, blocked", [(frozenset({4242}), False), (frozenset({1}), True), (None, True)])
def test_another_deployments_serve_on_the_gpu_is_not_a_foreign_process(owned: frozenset[int] | None,
                                                                       blocked: bool) -> None:
    from spark_supervisor.judge.admission import gpu_blockers
    from spark_supervisor.model import Gpu, GpuProcess
    c = cfg(stack(EMBED))
    v = c.view(c.deployments[1])
    gpu = Gpu("NVIDIA GB10", "580", None, None, (GpuProcess(2001, "/usr/lib/xorg/Xorg", 40),
                                                   GpuProcess(4242, "/usr/bin/python3", 90000)))
    o = obs(v, nodes={"spark-2": node_obs("spark-2", gpu=gpu, owned_pids=owned)})
    held = gpu_blockers(o, DeploymentView.of(v, v.deployment))
    assert bool(held) == blocked and (not blocked or held == ["spark-2: pid 4242 (/usr/bin/python3) 90000 MiB"])
