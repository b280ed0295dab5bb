"""What a reload would do to each deployment (classify.diff) and `spark-supervisor apply --dry-run`, which
shows it and acts on nothing (its proofs, with probe containers, run on the testbed: test_change.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import tomli_w

from spark_supervisor.change import classify
from spark_supervisor.change.classify import Change
from spark_supervisor.cli.main import main
from tests.helpers import cfg, with_image
from tests.unit.test_stack import EMBED, stack


def both() -> dict[str, Any]:
    return stack({**EMBED, "after": []})


@pytest.mark.parametrize("edit, qwen, differs, settings", [
    (lambda _: None, Change.UNCHANGED, (), ()),
    (lambda d: d["deployments"][0].setdefault("ray", {}).update(image="x/vllm:typo"), Change.REPLACE, ("ray",), ()),
    (lambda d: d["deployments"][0]["serve"].update(extra_args=["--max-model-len", "512"]), Change.SERVE_RESTART,
     ("serve",), ()),
    (lambda d: d["deployments"][0].setdefault("readiness", {}).update(deadline=1800), Change.SETTINGS,
     ("readiness",), ()),
    (lambda d: d.update(healing={"deep_probe_interval": 120}), Change.UNCHANGED, (), ("healing",)),
])
def test_each_deployments_change_is_named_and_the_others_are_untouched(edit: Any, qwen: Change,
                                                                       differs: tuple[str, ...],
                                                                       settings: tuple[str, ...]) -> None:
    d = both()
    d2 = copy.deepcopy(d)
    edit(d2)
    found, other = classify.diff(cfg(d), cfg(d2))
    assert [(c.name, c.change, c.differs) for c in found] == [("qwen", qwen, differs), ("embed", Change.UNCHANGED, ())]
    assert other == settings
    assert found[0].stops == (qwen in (Change.REPLACE, Change.SERVE_RESTART))


def test_added_and_removed_deployments() -> None:
    d = both()
    d2 = copy.deepcopy(d)
    d2["deployments"][1] = {**EMBED, "name": "rerank", "after": [], "serve": {**EMBED["serve"], "port": 8002}}
    found, _ = classify.diff(cfg(d), cfg(d2))
    assert [(c.name, c.change) for c in found] == [("qwen", Change.UNCHANGED), ("embed", Change.REMOVED),
                                                   ("rerank", Change.ADDED)]
    assert [c.stops for c in found] == [False, True, False]


class _Engines:
    """Each member's Docker engine as the dry run looks at it: the new image on spark-1 only (read-only calls)."""

    def __init__(self, view: Any) -> None:
        self.image = view.dep.ray.image
        self.nodes = {n.name: SimpleNamespace(docker=SimpleNamespace(
            image_id=lambda image, node=n.name: "sha256:" + "1" * 64 if node == "spark-1" and image == self.image
            else "")) for n in view.members}

    def close(self) -> None:
        pass


def test_apply_dry_run_shows_each_change_and_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_supervisor.world import observe
    monkeypatch.setattr(observe, "World", _Engines)
    d = both()
    old, new = tmp_path / "old.toml", tmp_path / "new.toml"
    old.write_text(tomli_w.dumps(with_image(d)))
    d2 = copy.deepcopy(d)
    d2["deployments"][0].setdefault("ray", {}).update(image="x/vllm:typo")  # image_pull "never": refused
    new.write_text(tomli_w.dumps(with_image(d2)))
    assert main(["apply", "--dry-run", str(new), "-c", str(old)]) == 1
    assert ': REFUSED: ImageMissing: x/vllm:typo is not on spark-2 and image_pull = "never"' in capsys.readouterr().out
    d2["deployments"][0]["ray"]["image_pull"] = "if-missing"
    new.write_text(tomli_w.dumps(with_image(d2)))
    before = (old.read_text(), new.read_text())
    assert main(["apply", "--dry-run", str(new), "-c", str(old)]) == 0
    out = capsys.readouterr().out
    assert f"a reload from {old} to {new} would (nothing is changed now):" in out
    assert "  qwen: replace (ray differ): not proven (--prove proves it in probe containers)\n" in out, out
    assert "    first: pull x/vllm:typo on spark-2 (size unknown)\n" in out and "  embed: unchanged\n" in out
    assert "on spark-1" not in out  # there already
    assert main(["--json", "apply", "--dry-run", str(new), "-c", str(old)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["change"] for r in doc["deployments"]] == ["replace", "unchanged"] and doc["refused"] == 0
    assert (old.read_text(), new.read_text()) == before
    with pytest.raises(SystemExit):  # only the dry run is offered: applying is the daemon's reload
        main(["apply", str(new), "-c", str(old)])
