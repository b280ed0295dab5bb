"""The record, on the testbed (issue 25): what a deployment ran on when it reached SERVING -- this machine's
real kernel (every node's host facts are read here; its fabric from its host tree), the node containers'
image IDs, the vLLM version the image check found in the image (the stand-in's `--version`:
STANDIN_VLLM_VERSION) --, a support bundle that holds none of the secrets planted in the config, the
environment and the serve's log, and an image re-tagged to other content between two starts, shown by
`record --diff` and in the failure that follows.

One bring-up, shared; the re-tag is last in the module (it leaves a FAILED daemon behind) and puts the tag
back where it was, whatever happens."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_testbed import hosttree, testbed
from spark_testbed.harness import BIN, OWNED, Supervisor, fault_file, verify_serving, write_config
from tests.integration.conftest import reset_testbed

pytestmark = pytest.mark.testbed

FAULT = fault_file()
VLLM = "0.33.0"  # etc/testbed.toml's STANDIN_VLLM_VERSION: what the stand-in's `--version` prints
PLANTED = {  # secrets, each where an operator might put one; none may reach a record, a diff or a report
    "api key": "sk-record-PLANTED-key-4242",
    "HF token in the serve's env": "hf_recordPLANTEDtoken",
    "token from the daemon's environment": "hf_recordENVPLANTED99",
    "webhook password": "hookPLANTEDpass",
    "webhook path token": "XXrecordPLANTEDhookXX",
}
ENV_TOKEN = "RECORD_TEST_HF_TOKEN"
OTHER = "spark-testbed/hostfs:record-other"


def patch(tmp: Path) -> dict[str, Any]:
    key = tmp / "api-key"
    key.write_text(PLANTED["api key"] + "\n")
    key.chmod(0o600)
    return {"supervisor": {"full_observe_interval": 3},
            "alerts": {"webhook": f"https://alice:{PLANTED['webhook password']}@127.0.0.1:9/services/T0/B0/"
                                  f"{PLANTED['webhook path token']}", "events": ["failed"], "attempts": 1,
                       "timeout": 1}}


def deployment(tmp: Path) -> dict[str, Any]:
    """The API key in a file, an HF token written in the serve's env, another from the daemon's environment
    (merged into etc/testbed.toml's serve env)."""
    return {"readiness": {"api_key_file": str(tmp / "api-key")},
            "serve": {"env": {"HF_TOKEN": PLANTED["HF token in the serve's env"],
                              "HUGGING_FACE_HUB_TOKEN": f"${{{ENV_TOKEN}}}"}}}


@pytest.fixture(scope="module")
def daemon(tb: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    reset_testbed()
    os.environ[ENV_TOKEN] = PLANTED["token from the daemon's environment"]
    tmp = tmp_path_factory.mktemp("record")
    d = Supervisor(write_config(tmp, patch(tmp), deployment=deployment(tmp)), tmp)
    d.wait_phase("SERVING", 240)
    yield d
    FAULT.unlink(missing_ok=True)
    if d.proc.poll() is None:
        d.stop(signal.SIGKILL)
    os.environ.pop(ENV_TOKEN, None)
    reset_testbed()


def cli(d: Supervisor, *args: str, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "spark-supervisor"), *args, "--config", str(config or d.config)],
                          capture_output=True, text=True, timeout=300)


def record(d: Supervisor, *args: str) -> dict[str, Any]:
    out = cli(d, "record", "--json", *args)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def image_of(node: str) -> str:
    """The image ID the node's container runs, as its engine says (not our adapter)."""
    return testbed.docker(node, "inspect", "--format", "{{.Image}}", OWNED[node]).stdout.decode().strip()


def short(image_id: str) -> str:
    return image_id[:len("sha256:") + 12] + "…"


def test_the_record_names_this_machines_kernel_the_images_ids_and_the_vllm_inside(daemon: Supervisor) -> None:
    d = daemon
    st = verify_serving(d)
    d.wait(lambda _: (d.state_dir / "deployments" / "testbed" / "records.jsonl").exists(), 30, "the record")
    rec = record(d)
    assert rec["verdict"] == "SERVING" and rec["good"] is True and rec["deployment"] == "testbed"
    for node in testbed.NODES:
        facts = rec["nodes"][node]
        assert facts["host"]["kernel"] == os.uname().release, facts["host"]
        assert facts["image"]["id"] == image_of(node), (facts["image"], image_of(node))
        assert facts["image"]["vllm"] == st["nodes"][node]["image"]["vllm_version"] == VLLM, facts["image"]
        assert facts["image"]["digest"] == "none"  # imported here, never pulled: no repo digest
        assert facts["gpu"]["cuda"] == "13.0" and facts["host"]["boot_id"] == st["nodes"][node]["host"]["boot_id"]
        assert facts["host"]["dgx"] == "none"  # its host tree has no /etc/dgx-release: "none", not "unknown"
        port = facts["fabric"]["rdma"][f"{hosttree.DEVICE}/{hosttree.PORT}"]  # read from its host tree
        assert (port["firmware"], port["gid_index"], facts["fabric"]["mtu"]) == (
            hosttree.FIRMWARE, hosttree.GID_INDEX, hosttree.MTU), facts["fabric"]
    assert rec["serve_id"] and rec["results"]["kv_cache_tokens"] == 409856
    assert rec["model"]["name"] == st["deployment"]["model"] and "--api-key" not in rec["serve"]["argv"]
    assert {"HF_TOKEN", "VLLM_API_KEY"} <= set(rec["serve"]["env"])  # by name only
    text = cli(d, "record")
    assert text.returncode == 0 and text.stdout.startswith("testbed: SERVING at "), text.stdout + text.stderr
    assert f"  kernel               {os.uname().release}\n" in text.stdout
    for secret in PLANTED.values():
        assert secret not in json.dumps(rec) and secret not in text.stdout


def test_a_report_holds_the_record_status_and_logs_and_none_of_the_secrets_planted(daemon: Supervisor,
                                                                                  tmp_path: Path) -> None:
    d = daemon
    verify_serving(d)
    log = (testbed.DIR / "serve-logs" / "testbed" / "spark-1" / "current").resolve()
    key, hf, env = PLANTED["api key"], PLANTED["HF token in the serve's env"], PLANTED["token from the daemon's environment"]
    with open(log, "a") as f:  # a serve that echoes its environment (some vLLM versions do)
        f.write(f"INFO env: VLLM_API_KEY={key} HF_TOKEN={hf} HUGGING_FACE_HUB_TOKEN={env}\n")
    out = tmp_path / "report.tar.gz"
    made = cli(d, "report", "--out", str(out))
    assert made.returncode == 0 and made.stdout.startswith(f"wrote {out} ("), made.stdout + made.stderr
    with tarfile.open(out) as tar:
        members = {m.name.split("/", 1)[1]: tar.extractfile(m).read().decode()  # type: ignore[union-attr]
                   for m in tar.getmembers()}
    assert {"README.txt", "config.json", "status.json", "transitions.txt", "testbed/records.jsonl",
            "testbed/record.txt", "testbed/logs/spark-1.log"} <= set(members), sorted(members)
    for name, content in members.items():
        for what, secret in PLANTED.items():
            assert secret not in content, f"the {what} is in {name}"
    assert "INFO env: VLLM_API_KEY=[redacted]" in members["testbed/logs/spark-1.log"]
    assert json.loads(members["status.json"])["phase"] == "SERVING"
    default = cli(d, "report")
    assert default.returncode == 0 and f"wrote {d.state_dir / 'reports'}/spark-supervisor-report-" in default.stdout


def test_an_image_retagged_to_other_content_shows_in_the_diff_and_in_the_failure_that_follows(
        daemon: Supervisor, tmp_path: Path) -> None:
    """The image's tag names other content on both nodes between two starts (a re-pull). A restart of the
    running daemon starts the images it pinned by ID at SERVING, so the second start is a new daemon's, after a
    teardown: it starts from the tag. The stand-in then hangs its completions (the fault file) and the repair
    budget is 0: FAILED, and what changed is the image."""
    d = daemon
    verify_serving(d)
    ran = {node: image_of(node) for node in testbed.NODES}
    assert {n: f["image"]["id"] for n, f in record(d)["nodes"].items()} == ran
    d.stop()  # on_stop = "leave": the containers stay, and go with the teardown
    assert cli(d, "teardown").returncode == 0
    other: dict[str, str] = {}
    again: Supervisor | None = None
    try:
        for node in testbed.NODES:  # the same files committed anew: another image ID, the same content
            testbed.docker(node, "create", "--name", "record-other", testbed.HOSTFS, "true")
            testbed.docker(node, "commit", "record-other", OTHER)
            testbed.docker(node, "rm", "-f", "record-other")
            testbed.docker(node, "tag", OTHER, testbed.HOSTFS)
            other[node] = testbed.docker(node, "image", "inspect", "--format", "{{.Id}}", OTHER).stdout.decode().strip()
            assert other[node] != ran[node]
        FAULT.write_text("hang-completions\n")
        config = write_config(tmp_path, {**patch(tmp_path), "healing": {"repair_budget": 0},
                                         "supervisor": {"full_observe_interval": 3, "state_dir": str(d.state_dir)}},
                              deployment=deployment(tmp_path))  # the same state directory: its records
        again = Supervisor(config, tmp_path, "after-retag")
        st = again.wait(lambda s: s["phase"] == "FAILED", 300, "FAILED on the re-tagged image")
        for node in testbed.NODES:
            assert f"image {short(ran[node])} → {short(other[node])}" in st["changed"], st["changed"]
        assert st["changed"].startswith("since the last good serve: image "), st["changed"]
        assert f"  {st['changed']}" in cli(again, "status").stdout
        diff = cli(again, "record", "--diff")
        assert diff.returncode == 0, diff.stdout + diff.stderr
        for node in testbed.NODES:
            assert f"nodes.{node}.image.id: {short(ran[node])} → {short(other[node])}\n" in diff.stdout, diff.stdout
        failed = record(again)
        assert failed["verdict"] == "FAILED" and failed["changed"] == st["changed"]
        assert {n: f["image"]["id"] for n, f in failed["nodes"].items()} == other
        assert again.events("record.changed"), again.tail()
    finally:
        FAULT.unlink(missing_ok=True)
        if again is not None:
            again.stop(signal.SIGKILL)
        for node in testbed.NODES:  # the failed deployment's containers gone, the tag back where it was
            testbed.docker(node, "rm", "-f", OWNED[node], check=False)
            testbed.docker(node, "tag", ran[node], testbed.HOSTFS, check=False)
            testbed.docker(node, "rmi", OTHER, check=False)
