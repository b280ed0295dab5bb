"""The whole config (the file's root table): its tables, the cross-checks between them (run as the rules of
checks.py), and the per-deployment view the reconcile machinery runs on."""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import PrivateAttr, model_validator

from ..base import redaction
from ..base.redaction import flag_values, secret_env
from .checks import RULES
from .fields import _raise, _Strict
from .schema import Deployment, Node, Stale
from .settings import Alerts, Changes, Healing, Memory, Metrics, Retry, Supervisor


def deployment_dir(state_dir: str, name: str) -> str:
    return os.path.join(state_dir, "deployments", name)


def known_secrets(cfg: Config, env: Mapping[str, str]) -> list[str]:
    """Every secret the config and the daemon's environment know of: each deployment's (deployment_secrets), the
    webhook's credentials, path and token-like segments, the alert command's arguments (a header, a token), and
    the secret-named values of ``env``. The longest first: a secret inside another is not left half."""
    found = {s for dep in cfg.deployments for s in deployment_secrets(cfg.view(dep), dep)}
    found |= set(redaction.url_secrets(cfg.alerts.webhook)) if cfg.alerts.webhook else set()
    found |= {a for a in cfg.alerts.command[1:] if len(a) >= 8 and not a.startswith("-")}
    found |= {v for k, v in env.items() if redaction.secret_env(k) and len(v) >= 4}
    return sorted(found, key=len, reverse=True)


def deployment_secrets(cfg: Config, dep: Deployment) -> list[str]:
    """What never goes into a log line or status: the API key, every secret-named variable's value the
    deployment's containers get, and the values of secret flags in its extra_args."""
    envs = [dep.serve.env, dep.ray.env, dep.ray.head_env, *(n.env for n in cfg.members(dep))]
    flags = flag_values([*dep.serve.extra_args, *dep.ray.extra_args])  # `--hf-token T` in extra_args
    return [x for x in (dep.api_key.get_secret_value(), *(v for e in envs for k, v in e.items() if secret_env(k)),
                        *flags) if x]


class Config(_Strict):
    supervisor: Supervisor = Supervisor()
    healing: Healing = Healing()
    retry: Retry = Retry()
    memory: Memory = Memory()
    metrics: Metrics = Metrics()
    alerts: Alerts = Alerts()
    changes: Changes = Changes()
    nodes: list[Node]
    stale: Stale = Stale()
    deployments: list[Deployment]
    _owners: frozenset[str] = PrivateAttr(default=frozenset())
    # What `check` reports but accepts: "<file>: <key>: <why>" lines, set by parse().
    _warnings: tuple[str, ...] = PrivateAttr(default=())

    @property
    def warnings(self) -> tuple[str, ...]:
        return self._warnings

    @model_validator(mode="after")
    def _cross_checks(self) -> Config:
        _raise([problem for rule in RULES for problem in rule(self)])
        return self

    @property
    def head(self) -> Node:
        return next(n for n in self.nodes if n.role == "head")

    def view(self, dep: Deployment) -> Config:
        """The settings one deployment runs on: its nodes only, its own state directory under ours (repair log,
        bests, status), and the names of every configured deployment (``owners``: their containers are
        nobody's orphans). The reconcile machinery runs on a ``config.view.DeploymentView``, whose ``cfg`` this
        is; ``DeploymentView.build`` makes both, once per (re)load."""
        sup = self.supervisor.model_copy(update={"state_dir": deployment_dir(self.supervisor.state_dir, dep.name)})
        v = self.model_copy(update={"deployments": [dep], "nodes": self.members(dep), "supervisor": sup})
        v._owners = frozenset(d.name for d in self.deployments)
        return v

    @property
    def owners(self) -> frozenset[str]:
        """Every configured deployment's name: a container labelled with one of them is owned."""
        return self._owners or frozenset(d.name for d in self.deployments)

    @property
    def deployment(self) -> Deployment:
        """The file's first deployment (a one-deployment config's only one); one deployment of many is a
        ``DeploymentView``'s ``dep``."""
        return self.deployments[0]

    def members(self, dep: Deployment) -> list[Node]:
        """The deployment's nodes, head first (Ray needs the head up before workers join)."""
        nodes = [n for n in self.nodes if not dep.nodes or n.name in dep.nodes]
        return sorted(nodes, key=lambda n: n.role != "head")

    def serve_node(self, dep: Deployment) -> Node:
        """Where the serve process runs: the head of its nodes."""
        return self.members(dep)[0]

    def endpoint(self, dep: Deployment) -> str:
        return dep.readiness.endpoint or f"http://{self.serve_node(dep).fabric_ip}:{dep.serve.port}"


