"""`make bench-beside` (issue 26, part 5): which release the current code is measured beside (a temporary git
repository), the environment a release's venv runs in, and the table the two are written in. Building a
release's venv is slow and is not done here."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from spark_testbed import harness
from spark_testbed.release import NoRelease, previous_release, release_config, release_env


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "tag.gpgSign=false",
                           "-c", "commit.gpgSign=false", *args], cwd=repo, capture_output=True, text=True, check=True,
                          timeout=30).stdout.strip()


def commit(repo: Path, text: str) -> str:
    (repo / "etc").mkdir(exist_ok=True)
    (repo / "etc" / "testbed.toml").write_text(f'[supervisor]\nnote = "{text}"\n')
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", text)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    git(tmp_path, "init", "-q")
    commit(tmp_path, "first")
    return tmp_path


def test_with_no_tag_there_is_no_release_and_it_says_so(repo: Path) -> None:
    commit(repo, "second")
    with pytest.raises(NoRelease, match="no release to compare with.*--beside TAG"):
        previous_release(repo)


def test_the_last_tag_before_head_is_the_previous_release(repo: Path) -> None:
    git(repo, "tag", "-a", "-m", "v0.1", "v0.1.0")
    commit(repo, "second")
    git(repo, "tag", "v0.2.0")  # a lightweight tag counts as well
    commit(repo, "third")
    assert previous_release(repo) == "v0.2.0"


def test_head_tagged_is_measured_beside_the_tag_before_it(repo: Path) -> None:
    git(repo, "tag", "-a", "-m", "v0.1", "v0.1.0")
    commit(repo, "second")
    git(repo, "tag", "-a", "-m", "v0.2", "v0.2.0")
    assert previous_release(repo) == "v0.1.0"


def test_head_tagged_with_no_tag_before_it_has_no_release(repo: Path) -> None:
    git(repo, "tag", "v0.1.0")
    with pytest.raises(NoRelease, match="other than on HEAD itself"):
        previous_release(repo)  # HEAD has no parent here
    commit(repo, "second")
    git(repo, "tag", "-d", "v0.1.0")
    git(repo, "tag", "v0.2.0")
    with pytest.raises(NoRelease):
        previous_release(repo)  # a parent, and no tag on it


def test_two_tags_on_head_both_count_as_head(repo: Path) -> None:
    git(repo, "tag", "v0.1.0")
    commit(repo, "second")
    git(repo, "tag", "v0.2.0")
    git(repo, "tag", "v0.2.0-final")
    assert previous_release(repo) == "v0.1.0"


def test_a_tag_that_does_not_exist_is_said_so(repo: Path, tmp_path: Path) -> None:
    from spark_testbed.release import release_venv
    with pytest.raises(NoRelease, match="no commit 'v9.9'"):
        release_venv(repo, "v9.9", tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_the_release_config_is_the_tags_own(repo: Path) -> None:
    git(repo, "tag", "v0.1.0")
    commit(repo, "second")
    assert release_config(repo, "v0.1.0") == {"supervisor": {"note": "first"}}


def test_a_release_runs_without_the_checkout_on_its_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PYTHONPATH", "/some/checkout")
    monkeypatch.setenv("SPARK_TESTBED_DIR", "/tb")
    assert "PYTHONPATH" not in release_env() and release_env()["SPARK_TESTBED_DIR"] == "/tb"
    assert "PYTHONPATH" not in harness.bin_env(tmp_path / "bin")
    assert harness.bin_env()["PYTHONPATH"] == "/some/checkout"  # the dev venv's own: as before


def test_write_config_starts_from_the_base_given(tmp_path: Path) -> None:
    import tomllib
    base = tomllib.loads((harness.ROOT / "etc" / "testbed.toml").read_text())
    base["supervisor"]["interval"] = 7
    kept = repr(base)
    d = tomllib.loads(harness.write_config(tmp_path, base=base).read_text())
    assert d["supervisor"]["interval"] == 7 and d["supervisor"]["state_dir"] == str(tmp_path / "state")
    assert repr(base) == kept  # the base itself is not changed
    assert tomllib.loads(harness.write_config(tmp_path).read_text())["supervisor"]["interval"] == 2
