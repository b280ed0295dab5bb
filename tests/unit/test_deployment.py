"""The per-deployment view (config.view.DeploymentView): made once from the whole config, it holds the same
facts the config's helpers compute, and each derived deadline with why it has its value."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from spark_supervisor import config
from spark_supervisor.config.view import DeploymentView, views
from spark_supervisor.specs import commands
from tests.fakes import FakeBackend, make
from tests.helpers import cfg, data
from tests.unit.test_stack import EMBED, stack


def mp_pair() -> dict[str, Any]:
    """vLLM's own multi-node mode across both Sparks, the worker listed first in the file."""
    d = data()
    d["nodes"].reverse()
    d["deployments"][0]["serve"]["distributed_executor_backend"] = "mp"
    return d


def test_members_are_the_deployments_own_nodes_head_first() -> None:
    whole = cfg(mp_pair())
    v = DeploymentView.build(whole, whole.deployments[0])
    assert [n.name for n in v.members] == ["spark-1", "spark-2"]  # the file lists spark-2 first
    assert v.serve_node.name == "spark-1" and v.name == "qwen"
    assert [n.name for n in v.serve_nodes] == ["spark-1", "spark-2"] and v.multi_node_mp
    assert v.master == "192.168.200.12:29501"


def test_a_deployment_on_part_of_the_nodes_sees_only_those() -> None:
    whole = cfg(stack(EMBED))
    v = views(whole)["embed"]
    assert [n.name for n in v.members] == ["spark-2"] and [n.name for n in v.serve_nodes] == ["spark-2"]
    assert not v.multi_node_mp and v.master == ""
    assert v.owners == {"qwen", "embed"} and v.state_dir == "/tmp/x/deployments/embed"
    assert [n.name for n in v.cfg.nodes] == ["spark-2"]


def test_facts_equal_what_the_config_helpers_compute() -> None:
    for d in (data(), mp_pair(), stack(EMBED)):
        whole = cfg(d)
        for dep in whole.deployments:
            v = views(whole)[dep.name]
            assert v.dep is dep
            assert (v.ray_hash, v.serve_hash) == (config.ray_hash(whole, dep), config.serve_hash(whole, dep))
            assert v.endpoint == whole.endpoint(dep)
            assert list(v.members) == whole.members(dep)
            assert list(v.serve_nodes) == commands.serve_nodes(whole, dep)
            assert list(v.secrets) == config.deployment_secrets(whole, dep)


def test_the_addresses_are_the_heads() -> None:
    v = views(cfg())["qwen"]
    assert v.endpoint == "http://192.168.200.12:8000"
    assert v.dashboard == "http://192.168.200.12:8265" and v.gcs == "192.168.200.12:6379"
    d = data()
    d["deployments"][0]["readiness"] = {"endpoint": "http://api.example:9000"}
    assert views(cfg(d))["qwen"].endpoint == "http://api.example:9000"


def test_each_deadline_follows_its_settings_and_says_why() -> None:
    d = data()
    d["supervisor"].update(io_timeout=20, ssh_connect_timeout=5)
    d["deployments"][0]["serve"]["stop_timeout"] = 30
    t = views(cfg(d))["qwen"].deadlines
    assert (t.docker.seconds, t.checks.seconds, t.api.seconds, t.probes.seconds, t.node.seconds, t.follower.seconds,
            t.ray_gcs.seconds) == (45, 90, 5, 25, 30, 30, 20)
    assert "stop_timeout + 15" in t.docker.why and "ssh_connect_timeout + 5" in t.node.why
    d["deployments"][0]["serve"]["stop_timeout"] = 1
    d["supervisor"]["io_timeout"] = 3
    t = views(cfg(d))["qwen"].deadlines
    assert (t.docker.seconds, t.api.seconds) == (16, 3)
    for deadline in dataclasses.asdict(t).values():
        assert deadline["why"]


def test_the_view_is_frozen() -> None:
    v = views(cfg())["qwen"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.ray_hash = "x"  # type: ignore[misc]


def test_a_reload_makes_each_view_once_and_the_backend_gets_the_reconcilers(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[DeploymentView] = []
    build = DeploymentView.build

    def counting(whole: config.Config, dep: config.Deployment) -> DeploymentView:
        made.append(build(whole, dep))
        return made[-1]
    monkeypatch.setattr(DeploymentView, "build", staticmethod(counting))
    daemon, _, _, _, path = make(tmp_path)
    given: list[DeploymentView] = []

    def factory(v: DeploymentView) -> FakeBackend:
        given.append(v)
        return FakeBackend()
    daemon.stack.backend_factory = factory
    assert len(made) == 1
    d = data()
    d["supervisor"] = {"state_dir": str(tmp_path / "state"), "interval": 2}
    path.write_text(tomli_w.dumps(d))
    daemon.reload()
    assert len(made) == 2 and len(given) == 1 and given[0] is made[1] and daemon.reconcilers["qwen"].view is made[1]
