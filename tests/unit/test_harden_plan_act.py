"""Issue 19 item 7 (the actor's logs): every argv the actor logs goes through redaction, with the API key
and every secret-named variable the deployment's containers get as known secrets; a helper's output in a
reason is redacted the same way."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import SecretStr

from spark_supervisor.model import DropPageCache, StartServe
from spark_supervisor.specs import commands
from spark_supervisor.world.act import ActionFailed, Actor
from tests.helpers import cfg, data, view_of

KEY, TOKEN = "sk-the-api-key-0123", "hf_secretvalue1234"


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, level: str) -> Any:
        return lambda event, **kw: self.lines.append((event, kw))


class Engine:
    def __init__(self, out: str = "") -> None:
        self.out = out

    def exec(self, _container: str, argv: list[str], **__: Any) -> tuple[int, str]:
        return 0, "serve-state 42 spec 2026-12-07T10:00:00Z 1\n" if argv[2:3] == [commands.SERVE_STATE] else ""

    def has_image(self, _image: str) -> bool:
        return True

    def run_once(self, _spec: Any) -> tuple[int, str]:
        return 1, self.out


def actor(extra_args: list[str], out: str = "", **serve: Any) -> tuple[Actor, Log]:
    d = data()
    d["deployments"][0]["serve"].update(extra_args=extra_args, **serve)
    c = cfg(d)
    c.deployment.readiness._api_key = SecretStr(KEY)
    world = SimpleNamespace(cfg=c, view=view_of(c), nodes={n.name: SimpleNamespace(node=n, docker=Engine(out), shell=None) for n in c.nodes})
    log = Log()
    return Actor(world, log), log  # type: ignore[arg-type]


@pytest.mark.parametrize("args", [
    ["--hf-token", TOKEN], [f"--hf-token={TOKEN}"], ["--hf-tok", TOKEN], [f"--hf_token={TOKEN}"],
    ["--chat-template", f"/x/{KEY}.jinja"], [f"--some-flag={TOKEN}"],
])
def test_serve_launched_never_logs_a_secret(args: list[str]) -> None:
    a, log = actor(args, env={"HF_TOKEN": TOKEN})
    a.run(StartServe())
    [(event, kw)] = [x for x in log.lines if x[0] == "serve.launched"]
    text = " ".join(kw["argv"])
    assert KEY not in text and TOKEN not in text and "[redacted]" in text
    assert kw["argv"][:2] == ["vllm", "serve"]  # the rest is still there to read


def test_a_secret_env_pair_in_the_command_is_redacted() -> None:
    a, log = actor([], command=["env", f"HF_TOKEN={TOKEN}", "vllm", "serve"])
    a.run(StartServe())
    [(_, kw)] = [x for x in log.lines if x[0] == "serve.launched"]
    assert "HF_TOKEN=[redacted]" in kw["argv"] and TOKEN not in " ".join(kw["argv"])


def test_a_helpers_output_in_a_reason_is_redacted() -> None:
    a, _ = actor([], out=f"VLLM_API_KEY={KEY} HF_TOKEN={TOKEN} sh: cannot write", env={"HF_TOKEN": TOKEN})
    d = a.world.cfg.nodes[0]
    with pytest.raises(ActionFailed) as e:
        a.run(DropPageCache(d.name))
    assert KEY not in str(e.value) and TOKEN not in str(e.value) and "cannot write" in str(e.value)
