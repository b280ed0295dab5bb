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


# ------------------------------------------------------------------------------------------- the table
def test_a_cell_is_the_median_the_worst_and_n() -> None:
    from spark_testbed.beside import cell
    assert cell([1.0, 3.0, 2.0], "{:.2f} s") == "2.00 s (worst 3.00 s, n=3)"
    assert cell([0.2, 0.31], "{:.2f} %") == "0.26 % (worst 0.31 %, n=2)"
    assert cell([], "{:.2f} s") == "-"


def test_the_table_puts_each_side_in_its_column_with_the_goal() -> None:
    from spark_testbed.beside import table
    results = {"cold": {"current": [{"overhead": 1.5, "total": 20.0}, {"overhead": 2.5, "total": 22.0},
                                    {"overhead": 1.0, "total": 21.0}],
                        "release v0.31.0": [{"overhead": 3.0, "total": 25.0}]},
               "idle": {"release v0.31.0": [{"cpu_percent": 0.3, "rss_mib": 70.04}]},
               "real": {"current": [{"cold_start": 80.0, "warm_repair": 40.0, "warm_over_cold": 0.5}]}}
    lines = table(results, ["current", "release v0.31.0"], 60)
    assert lines[0] == "| measure | current (median, worst, n) | release v0.31.0 (median, worst, n) | goal |"
    assert lines[1] == "|---|---|---|---|"
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines[2:]}
    assert rows["**supervisor overhead** (the rest, from process spawn)"] == (
        "| **supervisor overhead** (the rest, from process spawn) | 1.50 s (worst 2.50 s, n=3) "
        "| 3.00 s (worst 3.00 s, n=1) | <= 2 s median, worst <= 3 s |")
    assert rows["idle daemon CPU over 60 s, one deployment SERVING"].endswith(
        "| - | 0.30 % (worst 0.30 %, n=1) | <= 0.25 % of a core |")
    assert "| - | 70.0 MiB (worst 70.0 MiB, n=1) | <= 80 MB |" in rows["idle daemon resident memory (max), one deployment"]
    assert rows["**real vLLM: warm repair / cold start**"].endswith("| 0.50 (worst 0.50, n=1) | - | <= 0.55 |")
    assert rows["... after Ray marks the node DEAD"].endswith("| - | - | <= 1 s |")  # not measured yet
    assert all(line.count("|") == 5 for line in lines)


def test_the_document_says_the_machine_first_and_keeps_every_run() -> None:
    import json

    from spark_testbed.beside import document
    results = {"death": {"current": [{"detect": 0.9, "back": 6.0}]}}
    text = document({"cores (nproc)": "2", "load average at the start": "0.50 0.40 0.30"}, results,
                    ["current", "release v0.31.0"], 60, ["cold start, release v0.31.0, run 1/3: AssertionError: x"])
    head, rest = text.split("| measure |", 1)
    assert head == ("# make bench-beside: current beside release v0.31.0\n\n- cores (nproc): 2\n"
                    "- load average at the start: 0.50 0.40 0.30\n\n")
    assert "| serve killed -> repair started | 0.90 s (worst 0.90 s, n=1) | - | <= 1 s |" in rest
    assert "## Runs that failed\n\n- cold start, release v0.31.0, run 1/3: AssertionError: x\n" in rest
    runs = rest.split("```json\n")[1].split("```")[0].splitlines()
    assert [json.loads(line) for line in runs] == [{"group": "death", "side": "current",
                                                    "runs": [{"back": 6.0, "detect": 0.9}]}]


def test_the_sides_take_turns_run_by_run_and_a_failed_run_is_kept(tmp_path: Path) -> None:
    from spark_testbed.beside import Got, Record, Side, run
    sides = [Side("current", tmp_path / "a", None, tmp_path), Side("release v1", tmp_path / "b", {}, tmp_path)]
    order: list[str] = []
    seen_on_disk: list[str] = []
    out = tmp_path / "bench" / "results-beside.md"

    def measure(side: Side) -> Got:
        order.append(side.label)
        seen_on_disk.append(out.read_text() if out.exists() else "")
        if len(order) == 3:
            raise AssertionError("daemon exited with 1\nits log")
        return {"cold": [{"overhead": float(len(order))}]}

    record = Record(out, {"cores (nproc)": "2"}, [s.label for s in sides], 60)
    run(sides, [("cold start", 3, measure), ("faults", 1, measure)], record)
    assert order == ["current", "release v1"] * 4
    assert record.results["cold"]["current"] == [{"overhead": 1.0}, {"overhead": 5.0}, {"overhead": 7.0}]
    assert record.results["cold"]["release v1"] == [{"overhead": 2.0}, {"overhead": 4.0}, {"overhead": 6.0},
                                                   {"overhead": 8.0}]
    assert record.errors == ["cold start, current, run 2/3: AssertionError: daemon exited with 1"]
    assert "1.00 s (worst 1.00 s, n=1)" in seen_on_disk[2]  # written after each run, before the next
    assert "load average now (the bench still running)" in out.read_text()
    record.write(done=True)
    assert "load average at the end" in out.read_text() and not list(out.parent.glob("*.tmp"))


def test_the_bench_beside_runs_only_the_steps_named_in_their_order_and_refuses_an_unknown_one() -> None:
    from spark_testbed import beside

    names = [name for name, _, _ in beside.steps({}, 3, 60, ("stack", "idle"))]
    assert names == ["idle, one deployment", "idle, the stack"]
    assert len(beside.steps({}, 3, 60)) == len(beside.STEPS)
    with pytest.raises(ValueError, match="no such step: idel"):
        beside.steps({}, 3, 60, ("idel",))


def test_the_current_side_with_uncommitted_changes_to_the_wheels_sources_is_the_dev_venvs(
        repo: Path, tmp_path: Path) -> None:
    from spark_testbed import beside
    (repo / "spark_supervisor").mkdir()
    (repo / "spark_supervisor" / "x.py").write_text("A = 1\n")
    commit(repo, "code")
    (repo / "spark_supervisor" / "x.py").write_text("A = 2\n")
    assert beside.uncommitted(repo) == ["spark_supervisor/x.py"]
    side, note = beside.current_side(repo, tmp_path / "cache", tmp_path / "work", beside.uncommitted(repo))
    assert side.bin_dir == harness.BIN and "uncommitted" in note
    assert not (tmp_path / "cache").exists()  # nothing built


def test_uncommitted_names_a_renamed_paths_new_name_unquoted(repo: Path) -> None:
    from spark_testbed import beside
    (repo / "spark_supervisor").mkdir()
    (repo / "spark_supervisor" / "a -> b.py").write_text("A = 1\n")
    commit(repo, "code")
    subprocess.run(["git", "mv", "spark_supervisor/a -> b.py", "spark_supervisor/é \"q\".py"], cwd=repo, check=True)
    assert beside.uncommitted(repo) == ['spark_supervisor/é "q".py']


def test_an_older_current_venv_is_removed_with_its_link_and_a_link_made_by_hand_only_unlinked(tmp_path: Path) -> None:
    from spark_testbed.release import _unpublish
    ours = tmp_path / "current-HEAD-aaaa.x1y2"
    ours.mkdir()
    (tmp_path / "current-HEAD-aaaa").symlink_to(ours.name)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "current-HEAD-bbbb").symlink_to(elsewhere)
    _unpublish(tmp_path / "current-HEAD-aaaa")
    _unpublish(tmp_path / "current-HEAD-bbbb")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere"]
