"""No log line carries a secret, whatever the caller forgot (issue 19, item 6, defence in depth): the API
keys and secret environment values the daemon knows, and a URL's credentials, are replaced in every event,
through the real set-up (JSON on stderr and native journal entries)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from spark_supervisor.report import journal
from tests.helpers import data
from tests.unit.test_logs import parse


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(journal, "_secrets", ())
    yield
    structlog.reset_defaults()


def test_known_secrets_and_url_credentials_are_redacted_in_every_event(capsys: pytest.CaptureFixture[str],
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_from_the_environment")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    key = tmp_path / "key"
    key.write_text("sk-the-serve-key\n")
    key.chmod(0o600)
    d = data()
    d["deployments"][0]["readiness"] = {"api_key_file": str(key)}
    d["deployments"][0]["serve"]["env"] = {"MY_SECRET": "value-of-my-secret"}
    from spark_supervisor import config
    journal.register_config(config.parse(d, "/etc/x.toml", env={}))
    journal.setup(json=True)
    try:
        raise RuntimeError("token sk-the-serve-key in a traceback")
    except RuntimeError:
        journal.get(deployment="main").exception(
            "x.failed", argv=["vllm", "--api-ke", "sk-the-serve-key"], url="https://bob:pa55word@hook.example/x",
            nested={"env": {"A": "hf_from_the_environment"}, "hosts": ("ssh://root@spark-2",)},
            token_url="https://ghp_abcdef@github.com/x", parallel="false")
    err = capsys.readouterr().err
    line = json.loads(err)
    for secret in ("sk-the-serve-key", "hf_from_the_environment", "pa55word", "bob:", "ghp_abcdef"):
        assert secret not in err, err
    assert line["url"] == "https://[redacted]@hook.example/x"
    assert line["token_url"] == "https://[redacted]@github.com/x"
    assert line["argv"] == ["vllm", "--api-ke", "[redacted]"]
    assert line["nested"] == {"env": {"A": "[redacted]"}, "hosts": ["ssh://root@spark-2"]}  # a user, no secret
    assert "token [redacted] in a traceback" in line["exception"]
    assert line["parallel"] == "false"  # TOKENIZERS_PARALLELISM is no secret, and "false" too short anyway


def test_the_journal_entries_are_redacted_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(tmp_path / "journal.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(path)
    server.settimeout(10)
    monkeypatch.setattr(journal, "SOCKET", path)
    journal.register_secret("sk-registered-later")
    journal.setup(journal=True)
    try:
        journal.get(deployment="main").error("alert.failed", error="http://u:secretpw@10.0.0.1/h: sk-registered-later")
        entry = parse(server.recv(1 << 20))
    finally:
        server.close()
        if journal.sink:
            journal.sink.close()
    assert "secretpw" not in json.dumps(entry) and "sk-registered-later" not in json.dumps(entry)
    assert json.loads(entry["JSON"])["error"] == "http://[redacted]@10.0.0.1/h: [redacted]"


def test_short_values_are_not_secrets_and_the_registry_is_bounded() -> None:
    journal.register_secret("", "abc", "  ")
    assert journal._secrets == ()
    journal.register_secret(*(f"secret-{i:04}" for i in range(1000)))
    assert len(journal._secrets) == journal.MAX_SECRETS
