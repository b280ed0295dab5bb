"""The status document has one shape (statusdoc.DeploymentDoc, StatusDoc) for its writer and its readers.
mypy holds the writer to it and a reader's `doc["key"]`; a reader's `doc.get("key")` it does not check (a
TypedDict's get takes any key), so this test does: every key `status` reads is one the daemon writes (the
disagreement the review found: "fraction" written, "load_fraction" read)."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import pytest

from spark_supervisor import statusdoc
from spark_supervisor.cli import status
from spark_supervisor.model import Phase, Status
from tests.helpers import cfg

DEPLOYMENT_KEYS = statusdoc.DeploymentDoc.__required_keys__ | statusdoc.DeploymentDoc.__optional_keys__
FILE_KEYS = statusdoc.StatusDoc.__required_keys__ | statusdoc.StatusDoc.__optional_keys__


def test_the_written_document_has_exactly_its_keys() -> None:
    d = statusdoc.document(Status(phase=Phase.SERVING), None, cfg(), "/etc/x.toml", "abc", time.time(), 0.0)
    assert statusdoc.DeploymentDoc.__required_keys__ <= set(d) <= DEPLOYMENT_KEYS


def reads(path: Path, names: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line, key) for each `NAME.get("key")` and `NAME["key"]` on a variable holding a document."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        key = on = None
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                and node.args and isinstance(node.args[0], ast.Constant)):
            on, key = node.func.value, node.args[0].value
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            on, key = node.value, node.slice.value
        if isinstance(on, ast.Name) and on.id in names and isinstance(key, str) and isinstance(node, ast.expr):
            found.append((node.lineno, key))
    return found


def test_every_key_status_reads_is_written() -> None:
    got = reads(Path(status.__file__), ("doc", "one", "d"))
    assert len(got) > 20, got  # the scan finds the reader's reads (it would pass vacuously otherwise)
    unknown = [(line, key) for line, key in got if key not in FILE_KEYS]
    assert not unknown, f"cli/status.py reads keys the daemon never writes: {unknown}"


def test_status_says_which_serve_paths_ran_for_real_and_which_only_on_the_stand_in(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Ray's executor never runs on vLLM's CPU build, so the suite proves it on the stand-in only; mp runs the
    real server on one node and two (tests/integration/test_real_vllm.py, test_real_mp.py)."""
    from tests.helpers import data
    ray = statusdoc.document(Status(phase=Phase.SERVING), None, cfg(), "/etc/x.toml", "abc", time.time(), 0.0)
    d = data()
    d["deployments"][0]["serve"]["distributed_executor_backend"] = "mp"
    mp = statusdoc.document(Status(phase=Phase.SERVING), None, cfg(d), "/etc/x.toml", "abc", time.time(), 0.0)
    assert ray["deployment"]["backend"]["name"] == "ray" and "stand-in only" in ray["deployment"]["backend"]["evidence"]
    assert mp["deployment"]["backend"] == {"name": "mp", "nodes": 2, "evidence": statusdoc.EVIDENCE["mp"]}
    assert "real vLLM server" in statusdoc.EVIDENCE["mp"]
    status._print_deployment(mp)
    assert "backend: mp across 2 nodes: proven on the real vLLM server" in capsys.readouterr().out
