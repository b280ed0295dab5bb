import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from spark_supervisor import config
from spark_supervisor.cli import main
from tests.helpers import BASE, cfg, data

ROOT = Path(__file__).resolve().parents[2]


def problems(d: dict[str, Any], env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(config.ConfigError) as e:
        config.parse(d, "/etc/spark-supervisor/x.toml", env=env or {})
    return e.value.problems


def test_story_config_is_valid_and_describes_the_two_sparks() -> None:
    c = config.load(ROOT / "etc" / "spark-supervisor.toml")
    assert c.head.fabric_ip == "192.168.200.12"
    assert c.deployment.serve.tensor_parallel_size == 2
    assert [n.name for n in c.members(c.deployment)] == ["spark-1", "spark-2"]
    # The seed's deployment alone, as it serves on real Sparks: its model under the /models mount on both nodes,
    # an image with Ray (the recipe's), no HCA filter that matches no Spark device, Ray's own health checks.
    (dep,) = c.deployments
    assert dep.uses_ray and dep.serve.model == "/models/Qwen3.5-122B-A10B-FP8"
    assert dep.ray.volumes == ["/models:/models:ro"]
    assert dep.ray.image == "spark-vllm-ray:latest" and dep.ray.image_pull == "never"
    assert not any(k.startswith("NCCL_IB_HCA") for k in {**dep.ray.env, **dep.serve.env})
    assert not any(k.startswith("RAY_health_check") for k in {**dep.ray.env, **dep.ray.head_env})
    assert dep.ray.privileged and dep.ray.ulimits == {"memlock": -1, "nofile": 1048576}
    assert dep.ray.env["RAY_memory_monitor_refresh_ms"] == "0" and dep.serve.gpu_memory_utilization == 0.85
    assert c.stale.units == ["vllm-proxy", "vllm-embeddings", "vllm-reranker", "vllm-cluster"] and c.stale.disable
    assert c.stale.containers == ["vllm_node", "reranker", "vllm_embeddings"]
    assert not c.warnings


def test_the_stack_example_leaves_room_beside_its_shares_on_each_spark() -> None:
    """The auxiliary servers share a Spark with the LLM: the shares on a node leave at least the ~15 GiB the node
    uses outside them (desktop, Ray, the API server and engine processes) of its ~121 GiB of unified memory."""
    c = config.load(ROOT / "etc" / "examples" / "stack.toml")
    assert [d.name for d in c.deployments] == ["qwen", "embeddings", "reranker"]
    seed = config.load(ROOT / "etc" / "spark-supervisor.toml").deployment
    llm = c.deployments[0]
    assert (llm.ray, llm.serve.model) == (seed.ray, seed.serve.model)  # the same LLM, only its share lower
    assert llm.serve.gpu_memory_utilization < seed.serve.gpu_memory_utilization
    for node in c.nodes:
        shares = sum(d.serve.gpu_memory_utilization for d in c.deployments if node in c.members(d))
        assert (1 - shares) * 121 >= 15, (node.name, shares)
    assert all(d.ray.image == seed.ray.image for d in c.deployments) and not c.warnings


def test_the_image_recipe_builds_what_the_shipped_config_names_and_installs_the_testbeds_ray() -> None:
    """etc/vllm-ray.Dockerfile builds what the shipped config names, with the Ray the testbed runs (the integration
    test builds it offline from this venv's Ray: a different pin would find no wheel there). The schema has no
    default image: one left out is refused, naming the recipe (a default would change under an upgrade)."""
    import importlib.metadata
    import re
    recipe = (ROOT / "etc" / "vllm-ray.Dockerfile").read_text()
    image = config.load(ROOT / "etc" / "spark-supervisor.toml", env={}).deployment.ray.image
    assert image == "spark-vllm-ray:latest"
    assert f"docker build -t {image} - < etc/vllm-ray.Dockerfile" in recipe
    d = {**BASE, "deployments": [{"serve": {"model": "m/m", "tensor_parallel_size": 2}}]}
    with pytest.raises(config.ConfigError) as e:
        config.parse(d, "/etc/spark-supervisor/x.toml", env={})
    assert e.value.problems == ["/etc/spark-supervisor/x.toml: deployments[0].ray.image: required: the image every "
                                "node runs, e.g. \"spark-vllm-ray:latest\" built with etc/vllm-ray.Dockerfile (vLLM's "
                                "own images after 0.19.1 have no Ray; for the mp backend a vLLM image such as "
                                "\"vllm/vllm-openai:v0.19.1\" will do)"]
    pin = re.search(r"^ARG RAY_VERSION=(\S+)$", recipe, re.M)
    assert pin and pin[1] == importlib.metadata.version("ray")
    assert '"ray[default]==${RAY_VERSION}"' in recipe


def test_testbed_config_expands_environment_variables() -> None:
    # SRC is this checkout: the head's observation programs run here and must exist
    env = {"SPARK_TESTBED_DIR": "/srv/tb", "SPARK_TESTBED_SRC": str(ROOT), "SPARK_TESTBED_PYTHON": "/py"}
    c = config.load(ROOT / "etc" / "testbed.toml", env=env)
    assert c.supervisor.state_dir == "/srv/tb/supervisor"
    assert c.deployment.ray.command[0] == f"{ROOT}/.venv/bin/ray"


def test_missing_environment_variable_names_file_and_key() -> None:
    d = data(supervisor={"state_dir": "${NOPE}/x"})
    assert problems(d) == ["/etc/spark-supervisor/x.toml: supervisor.state_dir: environment variable NOPE is not set"]


def test_dollar_dollar_is_a_literal_dollar() -> None:
    d = data(supervisor={"state_dir": "/var/lib/a$$b"})
    assert config.parse(d, "t", env={}).supervisor.state_dir == "/var/lib/a$b"


@pytest.mark.parametrize("mutate, expected", [
    (lambda d: d["nodes"][0].update(colour="red"), "nodes[0].colour: unknown key"),
    (lambda d: d["supervisor"].update(interval="fast"), "supervisor.interval: Input should be a valid number"),
    (lambda d: d["nodes"][1].update(fabric_ip="192.168.200.300"), "nodes[1].fabric_ip: not an IP address"),
    (lambda d: d["deployments"][0]["serve"].update(tensor_parallel_size=4),
     "deployments[0].serve.tensor_parallel_size: TP x PP = 4 is larger than the 2 GPUs configured"),
    (lambda d: d["nodes"][0].update(role="worker", ssh="x", docker="ssh://x"), "nodes: no node has role"),
    (lambda d: d["nodes"][1].update(name="spark-1"), "nodes[1].name: duplicate node 'spark-1'"),
    (lambda d: d["nodes"][1].update(ssh=""), "nodes[1].ssh: a worker needs an SSH target"),
    (lambda d: d["nodes"][1].update(docker="local"), "nodes[1].docker: a worker's engine is remote"),
    (lambda d: d["deployments"][0]["serve"].update(extra_args="--x 'unclosed"),
     "deployments[0].serve.extra_args: cannot split into arguments"),
    (lambda d: d["deployments"][0]["serve"].pop("model"), "deployments[0].serve.model: required key is missing"),
    (lambda d: d["deployments"].append(d["deployments"][0]), "deployments[1].name: duplicate deployment 'qwen'"),
])
def test_each_problem_names_file_and_key(mutate: Callable[[dict[str, Any]], None], expected: str) -> None:
    d = data()
    mutate(d)
    found = problems(d)
    assert any(p.startswith(f"/etc/spark-supervisor/x.toml: {expected}") for p in found), found


def test_extra_args_are_split_once_at_load() -> None:
    d = data()
    d["deployments"][0]["serve"]["extra_args"] = "--max-model-len 65536 --chat-template '/a b.jinja'"
    assert cfg(d).deployment.serve.extra_args == ["--max-model-len", "65536", "--chat-template", "/a b.jinja"]


def test_spec_hashes_separate_ray_from_serve_and_ignore_probe_settings() -> None:
    a = cfg()
    d = data()
    d["deployments"][0]["readiness"] = {"poll_interval": 2}
    d["supervisor"]["interval"] = 1
    b = cfg(d)
    assert config.ray_hash(a, a.deployment) == config.ray_hash(b, b.deployment)
    assert config.serve_hash(a, a.deployment) == config.serve_hash(b, b.deployment)
    d["deployments"][0]["serve"]["gpu_memory_utilization"] = 0.8
    c = cfg(d)
    assert config.ray_hash(a, a.deployment) == config.ray_hash(c, c.deployment)
    assert config.serve_hash(a, a.deployment) != config.serve_hash(c, c.deployment)


def test_check_command_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.toml"
    good.write_text((ROOT / "etc" / "spark-supervisor.toml").read_text())
    assert main(["check", "--config", str(good)]) == 0
    bad = tmp_path / "bad.toml"
    bad.write_text((ROOT / "etc" / "spark-supervisor.toml").read_text().replace("interval = 5", "intervall = 5"))
    with pytest.raises(SystemExit) as e:
        main(["check", "--config", str(bad)])
    assert e.value.code == 2
    assert f"{bad}: supervisor.intervall: unknown key" in capsys.readouterr().err


def test_unreadable_and_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError, match="cannot read"):
        config.load(tmp_path / "missing.toml")
    p = tmp_path / "broken.toml"
    p.write_text("[nodes\n")
    with pytest.raises(config.ConfigError, match=f"{p}: not valid TOML"):
        config.load(p)


def test_base_is_untouched_by_builders() -> None:
    assert BASE["nodes"][1]["ssh"] == "root@spark-2"


def test_volumes_are_read_once_into_source_destination_and_mode() -> None:
    from spark_supervisor.config.container_fields import Volume, parse_volume
    d = data()
    d["deployments"][0].setdefault("ray", {})["volumes"] = ["/models:/models:ro", "hf-cache:/root/.cache"]
    c = cfg(d)
    assert c.deployments[0].ray.mounts == (Volume("/models", "/models", "ro"), Volume("hf-cache", "/root/.cache", "rw"))
    assert parse_volume("/models:/models:ro") is parse_volume("/models:/models:ro")  # read once, then kept


def test_the_metrics_address_is_read_once_into_host_and_port() -> None:
    from spark_supervisor.config.fields import Listen, parse_listen
    assert cfg(data(metrics={"listen": "10.0.0.1:9464"})).metrics.address == Listen("10.0.0.1", 9464)
    assert cfg(data(metrics={"listen": ":9464"})).metrics.address == Listen("127.0.0.1", 9464)  # no host: loopback
    off = cfg(data()).metrics
    assert (off.address, off.port) == (None, 0)
    assert parse_listen("10.0.0.1:9464") is parse_listen("10.0.0.1:9464")  # read once, then kept


def test_the_flags_read_from_extra_args_are_read_in_one_place() -> None:
    d = data()
    d["deployments"][0]["serve"]["extra_args"] = ["--revision", "abc", "--download-dir=/dl"]
    d["deployments"][0]["ray"] = {"extra_args": ["--ray-client-server-port=10002"]}
    dep = cfg(d).deployments[0]
    assert (dep.serve.revision, dep.serve.download_dir, dep.ray.client_port) == ("abc", "/dl", 10002)
    plain = cfg(data()).deployments[0]
    assert (plain.serve.revision, plain.serve.download_dir, plain.ray.client_port) == ("", "", 10001)


def test_a_release_configs_spec_hashes_are_unchanged_so_an_upgrade_adopts_what_serves() -> None:
    """bc869ac's hashes of the seed's config (computed by that release): a field added since, with its default,
    must not change them, or every deployment that serves is replaced by the upgrade (config.hashes)."""
    path = Path(__file__).parent.parent / "fixtures" / "upgrade" / "seed-bc869ac.toml"
    c = config.parse(tomllib.loads(path.read_text()), str(path), env={})
    assert (config.ray_hash(c, c.deployment), config.serve_hash(c, c.deployment)) == ("b3b5e9db4adb", "3432f4900249")
