"""`make bench-beside` (issue 26, part 5): which release the current code is measured beside (a temporary git
repository). Building a release's venv is slow and is not done here."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from spark_testbed.release import NoRelease, previous_release, release_config


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
