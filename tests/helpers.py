"""Builders for configs and observations used by the unit tests (no I/O)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from spark_supervisor import config
from spark_supervisor.config import HASH_LABEL, NODE_LABEL, OWNER_LABEL, ray_hash
from spark_supervisor.config.identity import node_container_name
from spark_supervisor.config.view import DeploymentView
from spark_supervisor.loop.daemon import Daemon
from spark_supervisor.loop.stack import Stack
from spark_supervisor.model import (
    Container,
    EndpointObservation,
    Gpu,
    GpuProcess,
    ImageReport,
    Memory,
    NodeObservation,
    Observation,
    Phase,
    RayNode,
    RayObservation,
    ServeObservation,
    Status,
)
from spark_supervisor.reconcile.reconciler import Reconciler

BASE: dict[str, Any] = {
    "supervisor": {"state_dir": "/tmp/x"},
    "nodes": [
        {"name": "spark-1", "role": "head", "fabric_ip": "192.168.200.12", "fabric_interface": "enp1s0f1np1"},
        {"name": "spark-2", "role": "worker", "fabric_ip": "192.168.200.13", "fabric_interface": "enp1s0f1np1",
         "ssh": "root@spark-2", "docker": "ssh://root@spark-2"},
    ],
    "stale": {"units": ["vllm-proxy", "vllm-cluster"], "disable": True},
    # The image named, not the schema's default: what the tests say of an image (a vLLM image without Ray, its
    # name in a reason or a record) stays theirs when the shipped default changes.
    "deployments": [{"name": "qwen", "ray": {"image": "vllm/vllm-openai:latest"},
                     "serve": {"model": "Qwen/Qwen3.5-122B-A10B-FP8", "served_model_name": "Qwen3.5",
                               "tensor_parallel_size": 2}}],
}


def data(**patch: Any) -> dict[str, Any]:
    d = copy.deepcopy(BASE)
    d.update(patch)
    return with_image(d)


TEST_IMAGE = "vllm/vllm-openai:latest"  # what a test's deployment runs unless it names its image (required)


def with_image(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` with TEST_IMAGE for each deployment that names none (a real config must: config.schema.Ray.image)."""
    d = copy.deepcopy(d)
    for dep in d.get("deployments") or ():
        if isinstance(dep, dict):
            ray = dep.setdefault("ray", {})
            if isinstance(ray, dict):
                ray.setdefault("image", TEST_IMAGE)
    return d


def cfg(d: dict[str, Any] | None = None) -> config.Config:
    return config.parse(with_image(d or data()), "test.toml", env={})


def view_of(c: config.Config) -> DeploymentView:
    """The view of a one-deployment test config's deployment: what the daemon hands the planner, the observer
    and the status document (they take views only; a test builds its own)."""
    return DeploymentView.of(c, c.deployment)


def sole(holder: Daemon | Stack) -> Reconciler:
    """The one deployment's reconciler of a test's one-deployment daemon or stack (the daemon itself has no
    "first deployment": every status it gives is of every deployment)."""
    (only,) = holder.reconcilers.values()
    return only


def ray_container(c: config.Config, node: str, *, state: str = "running", spec: str | None = None) -> Container:
    n = next(x for x in c.nodes if x.name == node)
    dep = c.deployment
    return Container(f"id-{node}", node_container_name(dep, n), dep.ray.image, state,
                     {OWNER_LABEL: dep.name, HASH_LABEL: spec or ray_hash(c, dep), NODE_LABEL: node})


def free_gpu() -> Gpu:
    return Gpu("NVIDIA GB10", "580.95.05", None, None, (GpuProcess(2001, "/usr/lib/xorg/Xorg", 40),))


def node_obs(name: str, containers: tuple[Container, ...] = (), **kw: Any) -> NodeObservation:
    kw.setdefault("units", ())
    kw.setdefault("gpu", free_gpu())
    kw.setdefault("memory", Memory(122880, 118000))
    return NodeObservation(name, containers=containers, **kw)


def ray_ok(c: config.Config) -> RayObservation:
    return RayObservation(True, nodes=tuple(RayNode(f"n{i}", n.fabric_ip, True, 1.0, n.role == "head")
                                            for i, n in enumerate(c.nodes)))


def obs(c: config.Config, *, deployed: bool = False, nodes: dict[str, NodeObservation] | None = None,
        ray: RayObservation | None = None, serve: ServeObservation | None = None,
        endpoint: EndpointObservation | None = None, at: float = 100.0, full: bool = True) -> Observation:
    if nodes is None:
        nodes = {n.name: node_obs(n.name, (ray_container(c, n.name),) if deployed else ()) for n in c.nodes}
    if deployed and ray is None:
        ray = ray_ok(c)
    return Observation(at, full, nodes, ray, serve, endpoint)


def serve_running(c: config.Config, log: str = "", pid: int = 77) -> ServeObservation:
    return ServeObservation(True, pid, "id-spark-1", True, None, config.serve_hash(c, c.deployment),
                            "2026-12-02T10:00:00Z", log)


def images(c: config.Config, **kw: Any) -> dict[str, ImageReport]:
    """Image checks that found what the deployment needs on every node (``kw`` overrides every report)."""
    dep = c.deployment
    fit = {"ray_path": "/usr/local/bin/ray", "ray_version": "2.60.0", "ray_python": "3.12.3", "dashboard": True,
           "vllm_path": "/usr/local/bin/vllm", "vllm_version": "0.33.0", "vllm_python": "3.12.3"}
    return {n.name: ImageReport(n.name, dep.ray.image, config.image_check_key(c, dep), **{**fit, **kw}) for n in c.members(dep)}


CONFIG_SRC = "/etc/spark-supervisor/x.toml"


def config_problems(d: dict[str, Any], env: dict[str, str] | None = None) -> list[str]:
    """What config.parse refuses in ``d`` (read as if from CONFIG_SRC; each deployment without an image given
    TEST_IMAGE, so that the problem asked about is the one found)."""
    import pytest
    with pytest.raises(config.ConfigError) as e:
        config.parse(with_image(d), CONFIG_SRC, env=env or {})
    return e.value.problems


def recorded_serve_pid(serve_dir: str | Path) -> str:
    """The pid the serve wrapper recorded in `process` ("" while there is none). The wrapper claims the slot
    twice, with its own pid and then with the serve's, so a test waits until it differs from the wrapper's."""
    try:
        return Path(serve_dir, "process").read_text().split()[0]
    except (OSError, IndexError):
        return ""


def phase_now(st: Status) -> Phase:
    """A status's phase, read afresh: after `assert x.status.phase == A`, mypy holds x.status.phase to A across
    the tick that changes it, and calls a later `== B` impossible."""
    return st.phase


def counted(monkeypatch: Any, owner: Any, name: str) -> list[tuple[Any, ...]]:
    """``owner.name`` from now on still runs, and each call's arguments are added to the list returned."""
    calls: list[tuple[Any, ...]] = []
    real = getattr(owner, name)

    def wrapper(*a: Any, **kw: Any) -> Any:
        calls.append(a)
        return real(*a, **kw)
    monkeypatch.setattr(owner, name, wrapper)
    return calls
