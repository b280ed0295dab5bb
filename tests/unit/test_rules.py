"""The planner's rule steps, each called alone (plan.RULES), as KubeRay's reconcile functions are tested."""

from __future__ import annotations

from spark_supervisor import plan as p
from spark_supervisor.config import Config
from spark_supervisor.model import (
    Container,
    Observation,
    Phase,
    RayNode,
    RayObservation,
    Reason,
    RemoveContainers,
    Status,
)
from tests.helpers import cfg, data, images, node_obs, obs, ray_ok, view_of

C = cfg()


def facts(o: Observation, st: Status | None = None, c: Config = C, now: float = 100.0) -> p.Facts:
    return p.Facts(o, st or Status(images=images(c)), view_of(c), now)


def test_the_steps_run_in_the_documented_order() -> None:
    assert [r.__name__ for r in p.RULES] == ["nodes_seen", "hygiene", "rebooted", "containers", "placement", "ray", "serve",
                                             "ranks", "readiness", "liveness"]


def test_hygiene_alone_finds_the_stale_container_and_nothing_else_decides_for_it() -> None:
    stale = Container("id-x", "vllm_node", "vllm/vllm-openai:v0.11", "running", {})
    o = obs(C, nodes={"spark-1": node_obs("spark-1", (stale,)), "spark-2": node_obs("spark-2")})
    d = p.hygiene(facts(o))
    assert d is not None and d.phase == Phase.CLEANING and d.actions == (RemoveContainers("spark-1", ("vllm_node",), "stale"),)
    assert p.nodes_seen(facts(o)) is None


def test_the_ray_step_alone_holds_a_node_merely_not_listed_and_repairs_a_dead_one() -> None:
    serving = Status(images=images(C))
    serving.advance(Phase.SERVING, Reason(), 0, 0)
    head_only = RayObservation(True, nodes=(ray_ok(C).nodes[0],))
    d = p.ray(facts(obs(C, deployed=True, ray=head_only), serving))
    assert d is not None and d.reason.startswith("RayNodeNotListed: spark-2") and not d.repair
    dead = RayObservation(True, nodes=(ray_ok(C).nodes[0], RayNode("n1", "192.168.200.13", False, 1.0)))
    d = p.ray(facts(obs(C, deployed=True, ray=dead), serving))
    assert d is not None and d.repair == "gang" and d.reason.startswith("RayNodeLost: spark-2")


def test_the_ray_step_has_nothing_to_say_about_an_mp_deployment() -> None:
    d = data()
    d["deployments"][0]["serve"].update(distributed_executor_backend="mp")
    mp = cfg(d)
    assert p.ray(facts(obs(mp, deployed=True, ray=None), c=mp)) is None
