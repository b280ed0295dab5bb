"""A change never costs a working model (issue 22, item 1), on the testbed: a reload that changes what a
serving deployment runs is proven on every member first (the image there and checked, the model there as the
image sees it) while the old one keeps serving; a proof that fails stops nothing and names the cause. One
bring-up, shared: each test verifies the deployment SERVING on the same containers before and after."""

from __future__ import annotations

import shutil
import signal
import tomllib
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from spark_testbed import testbed
from spark_testbed.harness import (
    OWNED,
    Supervisor,
    containers,
    owned_ids,
    serve_pids,
    verify_serving,
    write_config,
)
from tests.integration.conftest import reset_testbed

pytestmark = pytest.mark.testbed


@pytest.fixture(scope="module")
def daemon(tb: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Supervisor, Path]]:
    reset_testbed()
    tmp = tmp_path_factory.mktemp("change")
    config = write_config(tmp, {"healing": {"deep_probe_interval": 30}})
    d = Supervisor(config, tmp)
    d.wait_phase("SERVING", 240)
    yield d, config
    if d.proc.poll() is None:
        d.stop(signal.SIGKILL)
    reset_testbed()


def reload_to(d: Supervisor, config: Path, change: dict[str, Any]) -> dict[str, Any]:
    """The operator's edit and SIGHUP: the status once the change is refused. Then the file put back and
    SIGHUP again: the refusal is gone (the previous config, the same as the file, runs)."""
    doc = tomllib.loads(config.read_text())
    good = config.read_text()
    dep = doc["deployments"][0]
    for section, values in change.items():
        dep[section] = {**dep[section], **values}
    config.write_text(tomli_w.dumps(doc))
    try:
        d.proc.send_signal(signal.SIGHUP)
        return d.wait(lambda s: bool((s.get("reload") or {}).get("refused")), 120, "the change refused")
    finally:
        config.write_text(good)
        d.proc.send_signal(signal.SIGHUP)
        d.wait(lambda s: s.get("reload") is None, 60, "the refusal cleared by a reload of the good file")


OTHER = "Qwen/Only-On-Spark-1"  # a model spark-1 has and spark-2 lacks


def only_on_spark_1() -> Path:
    """OTHER in spark-1's cache: its copy of the testbed model under that name (the caller removes it)."""
    repo = testbed.model_snapshot("spark-1").parent.parent
    copy = repo.parent / ("models--" + OTHER.replace("/", "--"))
    shutil.rmtree(copy, ignore_errors=True)  # one an interrupted run left
    shutil.copytree(repo, copy, symlinks=True)
    for node in [n for n in testbed.NODES if n != "spark-1"]:  # and on no other node, whatever a run left there
        shutil.rmtree(testbed.model_snapshot(node).parent.parent.parent / copy.name, ignore_errors=True)
    return copy


def test_a_reload_to_an_image_tag_that_does_not_exist_keeps_the_old_one_serving(
        daemon: tuple[Supervisor, Path]) -> None:
    d, config = daemon
    verify_serving(d)
    before = owned_ids()
    st = reload_to(d, config, {"ray": {"image": "spark-testbed/hostfs:no-such-tag"}})
    refused = st["reload"]["refused"]
    assert len(refused) == 1 and refused[0].startswith("ChangeRefused: testbed: ImageMissing"), refused
    assert "spark-testbed/hostfs:no-such-tag" in refused[0], refused
    assert st["phase"] == "SERVING" and st["reload"]["error"], st["reload"]
    verify_serving(d)
    assert owned_ids() == before and not d.repairs(), "the old deployment untouched: same containers, no repair"
    assert [e for e in d.events("change.refused")]
    assert not [e for e in d.events("action.started") if e.get("action") == "RemoveContainers"]


def test_a_reload_to_a_serve_command_the_image_lacks_is_refused_with_nothing_stopped(
        daemon: tuple[Supervisor, Path]) -> None:
    """Issue 42, item 10: the serve's command changed alone (the same containers) is looked for in the image by
    the proof, not taken from the check kept for the old command: refused, 0 s dark."""
    d, config = daemon
    verify_serving(d)
    before, serves = owned_ids(), serve_pids("spark-1")
    st = reload_to(d, config, {"serve": {"command": ["/opt/no-such/bin/vllm", "serve"]}})
    refused = st["reload"]["refused"]
    assert len(refused) == 1 and refused[0].startswith("ChangeRefused: testbed: ImageLacksVllm"), refused
    assert "/opt/no-such/bin/vllm" in refused[0], refused
    verify_serving(d)
    assert owned_ids() == before and serve_pids("spark-1") == serves and not d.repairs()


def test_a_reload_to_a_model_missing_on_one_node_keeps_the_old_one_serving_and_names_the_node(
        daemon: tuple[Supervisor, Path]) -> None:
    d, config = daemon
    verify_serving(d)
    before = owned_ids()
    copy = only_on_spark_1()
    try:
        st = reload_to(d, config, {"serve": {"model": OTHER}})
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    refused = st["reload"]["refused"]
    assert len(refused) == 1 and refused[0].startswith("ChangeRefused: testbed: ModelMissing"), refused
    assert "spark-2" in refused[0] and OTHER in refused[0], refused
    verify_serving(d)
    assert owned_ids() == before and not d.repairs()
    assert "spark-1" not in refused[0].split(" Hint: ")[0], refused  # only the node that lacks it


def test_apply_dry_run_names_the_refusal_and_touches_nothing(daemon: tuple[Supervisor, Path]) -> None:
    """Issue 42, item 4: a dry run changes nothing anywhere. Without --prove it looks the image up on each member
    (no container at all); with --prove it proves in probe containers of what is already there: no pull, no
    prefetch, no removal, no state file -- what a reload would pull is said."""
    import subprocess

    from spark_testbed.harness import BIN
    d, config = daemon
    verify_serving(d)
    before = owned_ids()
    state = Path(tomllib.loads(config.read_text())["supervisor"]["state_dir"])
    kept = {p: p.read_bytes() for p in state.rglob("images.json")}
    doc = tomllib.loads(config.read_text())
    doc["deployments"][0]["ray"] = {**doc["deployments"][0]["ray"], "image": "spark-testbed/hostfs:no-such-tag"}
    new = config.parent / "new.toml"
    new.write_text(tomli_w.dumps(doc))

    def apply(*more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN / "spark-supervisor"), "apply", "--dry-run", str(new), "--config", str(config),
                               *more], capture_output=True, text=True, timeout=300)
    out = apply()
    assert out.returncode == 1, out.stdout + out.stderr
    assert ('  testbed: replace (ray differ): REFUSED: ImageMissing: spark-testbed/hostfs:no-such-tag is not on '
            'spark-1, spark-2 and image_pull = "never"') in out.stdout, out.stdout
    doc["deployments"][0]["ray"]["image_pull"] = "if-missing"
    new.write_text(tomli_w.dumps(doc))
    out = apply("--prove")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "testbed: replace (ray differ): not proven here: " in out.stdout, out.stdout
    assert "    first: pull spark-testbed/hostfs:no-such-tag on spark-1 (size unknown)" in out.stdout, out.stdout
    for node in ("spark-1", "spark-2"):  # nothing was pulled
        assert testbed.docker(node, "image", "inspect", "spark-testbed/hostfs:no-such-tag", check=False).returncode
    verify_serving(d)
    assert owned_ids() == before and not d.repairs()
    assert {p: p.read_bytes() for p in state.rglob("images.json")} == kept


def test_restart_serve_only_relaunches_the_serve_with_the_requester_logged_and_no_repair(
        daemon: tuple[Supervisor, Path]) -> None:
    import subprocess

    from spark_testbed.harness import BIN, serve_pids
    d, config = daemon
    st = verify_serving(d)
    before, pid = owned_ids(), serve_pids("spark-1")
    out = subprocess.run([str(BIN / "spark-supervisor"), "restart", "--serve-only", "--config", str(config)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "testbed: serve stopped; starting again (serve-only restart asked by" in out.stdout, \
        out.stdout + out.stderr
    asked = d.events("operator.restart")
    assert asked and asked[-1]["serve_only"] and "pid " in asked[-1]["by"], asked  # who asked: SO_PEERCRED
    d.wait(lambda s: s["phase"] == "SERVING" and s["since"] != st["since"], 180, "SERVING on the relaunched serve")
    st = verify_serving(d)
    assert owned_ids() == before and serve_pids("spark-1") != pid  # the containers stayed, the serve is new
    assert not d.repairs() and st["repairs"]["in_window"] == 0  # a start, not a repair


def test_a_tag_repulled_underneath_is_not_what_a_repair_starts(daemon: tuple[Supervisor, Path]) -> None:
    """Images pinned by ID (issue 22, item 3): the tag of the deployment's image moved to other content on
    spark-2 while it serves (by hand, by another tool); a repair there starts the image it ran, not the tag."""
    d, config = daemon
    verify_serving(d)
    name = OWNED["spark-2"]

    def image_of(container: str) -> str:
        return testbed.docker("spark-2", "inspect", "--format", "{{.Image}}", container).stdout.decode().strip()
    ran = image_of(name)
    st = d.status()
    assert st is not None
    assert st["nodes"]["spark-2"]["pinned_image"] == ran, st["nodes"]["spark-2"]
    t = datetime.now().timestamp()
    testbed.docker("spark-2", "tag", testbed.BUSYBOX, testbed.HOSTFS)  # the tag now names other content
    try:
        testbed.docker("spark-2", "rm", "-f", name)
        d.wait(lambda _: bool(d.repairs(t)), 120, "a repair")
        d.wait(lambda s: s["phase"] == "SERVING" and datetime.fromisoformat(s["since"]).timestamp() > t, 240,
               "SERVING after the repair")
        verify_serving(d)
        assert image_of(name) == ran, "the repair started the pinned image, not the re-pulled tag"
    finally:
        testbed.docker("spark-2", "tag", ran, testbed.HOSTFS)  # the tag back where it was


def test_a_change_to_a_model_one_node_lacks_is_prefetched_there_while_the_old_one_serves(
        daemon: tuple[Supervisor, Path], tmp_path: Path) -> None:
    """With [deployments.model] prefetch the proof fills spark-2 with the new model (copied from a directory the
    image sees) while the old spec keeps serving on the same containers; only then the switch. Last in the
    module: the deployment it leaves runs the new spec."""
    import os
    import threading
    d, config = daemon
    verify_serving(d)
    before = owned_ids()
    copy = only_on_spark_1()
    fetched = testbed.model_snapshot("spark-2").parent.parent.parent / copy.name
    try:
        # The source: a plain directory the image sees at /model-src; its last file a FIFO that holds the copy until
        # the test has seen the old deployment still serving (a slow disk, made deterministic).
        src = tmp_path / "src"
        shutil.copytree(testbed.model_snapshot("spark-1"), src)
        fifo = src / "zz-slow.bin"
        os.mkfifo(fifo)
        doc = tomllib.loads(config.read_text())
        dep = doc["deployments"][0]
        hf = [f"{testbed.DIR}/{n}/hf:{testbed.DIR}/{n}/hf" for n in testbed.NODES]  # writable, under the read-only mount
        dep["ray"] = {**dep["ray"], "volumes": [*dep["ray"].get("volumes", []), *hf, f"{src}:/model-src:ro"]}
        dep["serve"] = {**dep["serve"], "model": OTHER}
        dep["model"] = {**dep.get("model", {}), "prefetch": True, "prefetch_from": "/model-src"}
        config.write_text(tomli_w.dumps(doc))
        t = datetime.now().timestamp()
        try:
            d.proc.send_signal(signal.SIGHUP)
            d.wait(lambda _: bool([e for e in d.events("model.prefetch_started") if e.get("node") == "spark-2"]), 180,
                   "the proof's prefetch on spark-2")
            st = d.wait(lambda s: bool((s.get("reload") or {}).get("proving")), 30, "the pending change shown")
            assert "once its new spec is proven on every member" in st["reload"]["proving"], st["reload"]
            # The old spec serves on, on the same containers, while the new model is fetched beside it (the
            # prefetch's own container on spark-2).
            st = d.status() or {}
            assert st.get("phase") == "SERVING" and owned_ids() == before and not d.repairs(t), st.get("reason")
            assert "testbed-model-spark-2" in containers("spark-2")
            assert not [e for e in d.events("model.prefetch_started") if e.get("node") == "spark-1"], "spark-1 has it"
        finally:
            writer = threading.Thread(target=lambda: fifo.write_bytes(b"x" * 1000), daemon=True)
            writer.start()  # (opening a FIFO for writing waits for its reader)
            writer.join(60)
        d.wait(lambda s: s["phase"] == "SERVING" and datetime.fromisoformat(s["since"]).timestamp() > t, 300,
               "SERVING on the new spec")
        verify_serving(d)
        assert owned_ids() != before and not d.repairs(t), "switched once proven: a replacement, not a repair"
        ended = [e for e in d.events("model.prefetch_ended") if e.get("node") == "spark-2"]
        assert ended and ended[-1]["state"] == "done", ended
        assert (fetched / "refs" / "main").is_file(), "the new model copied into spark-2's cache"
    finally:
        shutil.rmtree(copy, ignore_errors=True)
        shutil.rmtree(fetched, ignore_errors=True)
