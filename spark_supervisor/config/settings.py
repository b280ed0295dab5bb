"""The config's tables of the supervisor's own settings, one model each ([supervisor], [healing], [retry],
[metrics], [changes], [alerts], [memory]), each checking itself; a change to one applies in place."""

from __future__ import annotations

import os
import re
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from .fields import (
    AbsPath,
    Listen,
    OptionalArgv,
    Sec60,
    Sec120,
    Sec600,
    Sec3600,
    SecDay,
    SecMonth,
    _port,
    _q,
    _raise,
    _Strict,
    _system_dir,
    parse_listen,
)


class Supervisor(_Strict):
    state_dir: AbsPath = "/var/lib/spark-supervisor"
    interval: Sec3600 = 5
    transition_interval: Sec600 = 1
    full_observe_interval: SecDay = 60
    io_timeout: Sec600 = 20
    ssh_connect_timeout: Sec120 = 5
    backoff_base: Sec3600 = 5
    backoff_max: SecDay = 300
    ready_when: Literal["serving", "started"] = "serving"
    # No progress this long while starting: stop extending systemd's timeout. Above readiness.stall_timeout
    # (900): a quiet torch.compile must not get the daemon killed before the stall is even judged.
    start_stall_timeout: SecDay = 1200
    on_stop: Literal["leave", "teardown"] = "leave"

    @model_validator(mode="after")
    def _checks(self) -> Supervisor:
        problems = []
        if os.path.normpath(self.state_dir) == "/":
            problems.append((".state_dir", "must not be '/': use e.g. /var/lib/spark-supervisor"))
        elif why := _system_dir(self.state_dir):
            problems.append((".state_dir", why))
        if self.backoff_max < self.backoff_base:
            problems.append((".backoff_max", f"{self.backoff_max:g} is less than backoff_base "
                             f"{self.backoff_base:g}: the cap must be at least the first delay"))
        _raise(problems)
        return self


class Healing(_Strict):
    health_failure_threshold: Annotated[int, Field(ge=1, le=100)] = 2  # consecutive /health failures before a repair
    deep_probe_interval: SecDay = 60  # a tiny real completion: /health stays 200 when workers are wedged
    deep_probe_timeout: Sec3600 = 30
    deep_failure_threshold: Annotated[int, Field(ge=1, le=100)] = 2
    # The engine's heartbeat (its /metrics, each tick): requests running and nothing moving this long is a
    # wedge if a deep probe then fails too. 0: not read.
    heartbeat_stall: Annotated[float, Field(ge=0, le=600)] = 20
    quick_check_interval: Sec60 = 1  # Ray nodes and /health between ticks while serving
    repair_budget: Annotated[int, Field(ge=0, le=100)] = 3
    repair_window: SecMonth = 6 * 3600
    node_patience: SecDay = 300  # an unreachable peer: wait this long before tearing down the rest
    unknown_patience: SecDay = 60  # an observation "unknown" this long: DEGRADED (never destructive)

    @model_validator(mode="after")
    def _checks(self) -> Healing:
        if self.deep_probe_timeout >= self.deep_probe_interval:
            _raise([(".deep_probe_timeout", f"{self.deep_probe_timeout:g} s is not less than deep_probe_interval "
                     f"{self.deep_probe_interval:g} s: probes would overlap; lower it or raise the interval")])
        return self


class Retry(_Strict):
    """How a transient adapter error (engine, SSH, HTTP hiccup) is retried, in tenacity's terms."""

    stop_after_attempt: Annotated[int, Field(ge=1, le=10)] = 3
    stop_after_delay: Sec600 = 10
    wait_initial: Sec60 = 0.2
    wait_max: Sec60 = 2

    @model_validator(mode="after")
    def _checks(self) -> Retry:
        if self.wait_max < self.wait_initial:
            _raise([(".wait_max", f"{self.wait_max:g} is less than wait_initial {self.wait_initial:g}")])
        return self


class Metrics(_Strict):
    listen: str = ""  # "127.0.0.1:9464" to serve Prometheus metrics; empty: off

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        if v and not re.match(r"^[^:\s]*:\d{1,5}$", v):
            raise ValueError(f"expected host:port, e.g. \"127.0.0.1:9464\", got {v!r}")
        if v:
            _port(parse_listen(v).port)
        return v

    @property
    def address(self) -> Listen | None:
        """``listen`` read once (config.fields.parse_listen), None when metrics are off."""
        return parse_listen(self.listen) if self.listen else None

    @property
    def port(self) -> int:
        """The port of ``listen``, 0 when metrics are off."""
        return self.address.port if self.address else 0


class Changes(_Strict):
    """How a reload that changes what a deployment runs is carried out (docs/healing.md, "Changes: prove, then switch")."""

    # A switched-to spec that fails before it serves (FAILED, or a failed attempt at its start or
    # verification) is replaced again by the last spec that served: its compile cache is still warm.
    rollback: bool = True


class Alerts(_Strict):
    """Where the daemon tells someone outside: a webhook (a small JSON document POSTed) and/or a command
    (argv; the same document on its standard input). Sent from a background thread, retried, rate limited."""

    webhook: str = ""  # http(s)://... ; may carry a token in its path, so it is never logged whole
    command: OptionalArgv = []
    events: list[Literal["failed", "degraded", "repair", "recovered", "paused", "resumed", "change_refused",
                         "rolled_back"]] = ["failed", "degraded", "repair", "recovered", "change_refused", "rolled_back"]
    min_interval: SecDay = 300  # the same event of the same deployment at most this often (the rest are counted)
    timeout: Sec60 = 5  # each POST or command
    attempts: Annotated[int, Field(ge=1, le=10)] = 3

    @field_validator("webhook")
    @classmethod
    def _webhook(cls, v: str) -> str:
        if v and not re.match(r"^https?://[^\s/]+(/\S*)?$", v):
            raise ValueError(f"expected an http:// or https:// URL, e.g. \"http://127.0.0.1:9099/hook\", got "
                             f"{_q(v[:80])}")
        return v

    @property
    def enabled(self) -> bool:
        return bool(self.webhook or self.command)


class Memory(_Strict):
    """GB10's unified memory: vLLM's start-up check reads MemFree (page cache counts as used)."""

    page_cache: Literal["drop", "never"] = "drop"  # drop it when it is what stands between MemFree and the need
    kv_cache_regression: Annotated[float, Field(gt=0, lt=1)] = 0.2  # a start this far below the best: a warning
    # Deployments sharing a node: their gpu_memory_utilization add up to at most 1 minus this (the
    # allowed GPU processes, Xorg and gnome-shell, and the CUDA contexts live in it).
    share_margin: Annotated[float, Field(ge=0, lt=1)] = 0.05

