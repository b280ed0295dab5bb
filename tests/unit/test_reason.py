"""Reasons are values (model.reason.Kind): each kind knows whether it is deterministic, the package names a
kind by its member and matches it by value, and the text operators and tests read is unchanged."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from spark_supervisor.judge import logscan
from spark_supervisor.model import Kind, Reason
from spark_supervisor.model.reason import deterministic
from spark_supervisor.world.act import ActionFailed

PACKAGE = Path(__file__).resolve().parents[2] / "spark_supervisor"
CAMEL = re.compile(r"[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+")


def sources() -> list[tuple[str, ast.AST]]:
    return [(p.relative_to(PACKAGE).as_posix(), ast.parse(p.read_text())) for p in sorted(PACKAGE.rglob("*.py"))
            if "scripts" not in p.parts]


def test_a_reason_renders_as_before() -> None:
    why = Reason(Kind.SERVE_FAILED, "BadArguments: fix it")
    assert str(why) == "ServeFailed: BadArguments: fix it" and f"{why.kind}" == "ServeFailed"
    assert json.dumps({"reason_kind": why.kind}) == '{"reason_kind": "ServeFailed"}'
    assert str(Reason(Kind.NODE_LOST)) == "NodeLost" and str(Reason(detail="loading")) == "loading"
    assert Reason(Kind.NODE_LOST) == Reason("NodeLost")  # a status read back compares equal


def test_kinds_are_distinct_camel_case_values() -> None:
    values = [k.value for k in Kind]
    assert len(values) == len(set(values)) and all(re.fullmatch(r"[A-Z][A-Za-z0-9]*", v) for v in values)


def test_deterministic_is_the_kinds() -> None:
    for kind, _, _ in logscan.FAILURES:
        f = logscan.Failure(kind, "")
        assert f.deterministic is kind.deterministic
    assert Kind.BAD_ARGUMENTS.deterministic and not Kind.NCCL_ERROR.deterministic
    assert deterministic("PortInUse") and not deterministic("DockerTimeout")  # not a Kind: an adapter's
    assert ActionFailed(Kind.IMAGE_MISSING, "x").deterministic
    assert not ActionFailed(Kind.SYSTEMCTL_FAILED, "x").deterministic
    assert not ActionFailed("ImageMissing", "x", deterministic=False).deterministic  # the case decides


@pytest.mark.parametrize("call", ["Reason", "ActionFailed"])
def test_the_package_names_each_kind_by_its_member(call: str) -> None:
    found = [f"{rel}:{n.lineno}" for rel, tree in sources() for n in ast.walk(tree)
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == call and n.args
             and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)]
    assert found == [], found


def _camel(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return bool(CAMEL.match(node.value))
    return isinstance(node, ast.Tuple) and any(_camel(e) for e in node.elts)


def test_nothing_matches_a_reason_by_its_text() -> None:
    """No `x.startswith("SomeKind")`, `x == "SomeKind"` or `x in ("SomeKind", ...)`: a kind is matched by
    its member (a `"MemFree" in table` lookup has the literal on the left: not a match of a reason)."""
    found = []
    for rel, tree in sources():
        for n in ast.walk(tree):
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                    and n.func.attr in ("startswith", "endswith") and n.args and _camel(n.args[0])):
                found.append(f"{rel}:{n.lineno}")
            elif (isinstance(n, ast.Compare) and any(isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn)
                                                     for op in n.ops) and any(_camel(c) for c in n.comparators)):
                found.append(f"{rel}:{n.lineno}")
    assert found == [], found
