"""Secrets never reach what diagnose and the model check show: an out-of-band argv, an error's text, a
deployment's secret variables and API key (redaction, by the deployment's secrets: config.deployment_secrets)."""

from pathlib import Path
from types import SimpleNamespace

from spark_supervisor.adapters import AdapterError
from spark_supervisor.config import Config, deployment_secrets
from spark_supervisor.judge import modelcheck
from spark_supervisor.model import ModelReport
from spark_supervisor.specs import commands
from spark_supervisor.world import diagnose
from tests.helpers import cfg, data, view_of

TOKEN = "hf_live_token_0123456789"
KEY = "sk-live-key-abcdef"


def _cfg(tmp_path: Path, oob: list[str] | None = None) -> Config:
    key = tmp_path / "key"
    key.write_text(KEY + "\n")
    key.chmod(0o600)
    d = data()
    d["deployments"][0]["readiness"] = {"api_key_file": str(key)}
    d["deployments"][0]["serve"]["env"] = {"HF_TOKEN": TOKEN}
    if oob is not None:
        d["nodes"][1]["oob"] = oob
    return cfg(d)


def test_the_deployments_secrets_are_its_key_and_its_secret_variables(tmp_path: Path) -> None:
    c = _cfg(tmp_path)
    assert set(deployment_secrets(c, c.deployment)) == {KEY, TOKEN}
    shown = commands.shown_argv(c, c.deployment, ["vllm", "serve", "m", "--api-ke", "x1234", f"--hf-token={TOKEN}",
                                                  f"HF_TOKEN={TOKEN}", f"--note={KEY}"])
    assert not any(s in a for a in shown for s in (KEY, TOKEN, "x1234"))


def test_diagnose_shows_no_secret_in_an_oob_argv_or_an_error(tmp_path: Path) -> None:
    c = _cfg(tmp_path, ["/bin/false", f"--api-key={KEY}", f"--token-from={TOKEN}"])
    node = c.nodes[1]

    def fail() -> None:
        raise AdapterError("SshFailed", f"ssh -o X {node.ssh} env HF_TOKEN={TOKEN} exited 255")

    docker = SimpleNamespace(containers=lambda: (_ for _ in ()).throw(AdapterError("DockerFailed", f"key {KEY}")),
                             version=lambda: "27")
    a = SimpleNamespace(node=node, docker=docker, shell=SimpleNamespace(check=fail))
    layers = diagnose._layers(SimpleNamespace(cfg=c, view=view_of(c)), a, 5)  # type: ignore[arg-type]
    text = "\n".join(f"{lay.name} {lay.detail}" for lay in layers)
    assert "out-of-band" in text and "SSH" in text and "Docker engine" in text
    assert KEY not in text and TOKEN not in text


def test_the_model_missing_reason_quotes_no_secret(tmp_path: Path) -> None:
    c = _cfg(tmp_path)
    dep = c.deployment
    bad = ModelReport("spark-1", dep.serve.model, "k", source="hub", cache="/root/.cache/huggingface/hub",
                      missing=("config.json",), prefetched=True, detail=f"HTTPError: 401 for token {TOKEN}")
    kind, detail = modelcheck.problem(c, dep, {"spark-1": bad}) or ("", "")
    assert kind == "ModelMissing" and "401 for token" in detail and TOKEN not in detail
