"""The record (issue 25): what a deployment ran on each time it reached SERVING, kept as a bounded history;
two records compared field by field; what changed since the last good one named in every bad verdict.
Built from fakes here (record.build and record.diff are pure; the store on a real directory); through the
daemon on the fake backend for the loop's part."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from spark_supervisor import config
from spark_supervisor.model import (
    Gid,
    Gpu,
    HostFacts,
    ImageReport,
    Link,
    ModelReport,
    PerfVerdict,
    RdmaPort,
    Transport,
)
from spark_supervisor.model.host import NONE
from spark_supervisor.report.record import Decided, Sources, build, diff, what_changed
from spark_supervisor.report.record.text import render, render_diff
from spark_supervisor.state import records
from tests.helpers import cfg, data, images, view_of, with_image

IF = "enp1s0f1np1"
IPS = {"spark-1": "192.168.200.12", "spark-2": "192.168.200.13"}
A, B = "sha256:" + "a" * 64, "sha256:" + "b" * 64
KERNEL = "6.17.0-1032-nvidia"


def mapped(ip: str) -> str:
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a << 8 | b:04x}:{c << 8 | d:04x}"


def host(node: str, *, kernel: str = KERNEL, mtu: int = 9000, gid_at: int = 3, fw: str = "28.45.1200",
         dgx: str = "NVIDIA DGX Spark 7.2.1", rdma: bool = True) -> HostFacts:
    ip = IPS[node]
    port = RdmaPort("rocep1s0f1", 1, "ACTIVE", 200.0, fw, (Gid(gid_at, mapped(ip), ip, "RoCE v2", IF),))
    return HostFacts(f"boot-{node}", f"machine-{node}", (Link(IF, "up", mtu, 200000),), (port,) if rdma else (),
                     kernel=kernel, hostname=node, os="Ubuntu 24.04.3 LTS", os_version="24.04", dgx=dgx)


def checked(c: config.Config, image_id: str = A, **kw: Any) -> dict[str, ImageReport]:
    model = ModelReport("x", c.deployment.serve.model, "k", path="/hub/models--Qwen/snapshots/0123abcd", source="hub",
                        files=39, bytes=119 << 30, revision="0123abcd", config_sha256="c" * 64)
    fields = {"image_id": image_id, "repo_digests": ("vllm/vllm-openai@sha256:" + "d" * 64,), "torch_version": "2.9.0",
              "nccl_version": "2.27.7", "model": model, **kw}
    return {n: dataclasses.replace(r, **fields) for n, r in images(c).items()}


def sources(c: config.Config | None = None, **kw: Any) -> Sources:
    c = c or cfg()
    base: dict[str, Any] = {
        "hosts": {n: host(n) for n in IPS}, "gpus": {n: Gpu("NVIDIA GB10", "580.95.05", cuda="13.0") for n in IPS},
        "running": dict.fromkeys(IPS, A), "images": checked(c), "serve_id": "serve-1", "kv_tokens": 409856,
        "bringup": {"DETECTING": 1.0, "LOADING": 412.0},
        "transports": (Transport(0, IPS["spark-1"], "IB"), Transport(1, IPS["spark-2"], "IB"))}
    return Sources(view_of(c), 1.7e9, **{"verdict": "SERVING", **base, **kw})


# ------------------------------------------------------------------------------------------------- build
def test_a_record_names_each_members_host_gpu_fabric_and_image_and_the_model() -> None:
    r = build(sources())
    n2 = r["nodes"]["spark-2"]
    assert n2["host"] == {"hostname": "spark-2", "kernel": KERNEL, "os": "Ubuntu 24.04.3 LTS", "os_version": "24.04",
                          "dgx": "NVIDIA DGX Spark 7.2.1", "boot_id": "boot-spark-2"}
    assert n2["gpu"] == {"name": "NVIDIA GB10", "driver": "580.95.05", "cuda": "13.0"}
    assert n2["fabric"] == {"interface": IF, "mtu": 9000, "speed_gbps": 200.0, "rdma": {"rocep1s0f1/1": {
        "firmware": "28.45.1200", "state": "ACTIVE", "rate_gbps": 200.0, "gid_index": 3}}}
    assert n2["image"] == {"id": A, "digest": "vllm/vllm-openai@sha256:" + "d" * 64, "vllm": "0.33.0", "torch": "2.9.0",
                           "transformers": "unknown", "ray": "2.60.0", "nccl": "2.27.7", "python": "3.12.3"}
    assert r["model"] == {"name": "Qwen/Qwen3.5-122B-A10B-FP8", "revision_asked": NONE, "source": "hub",
                          "path": "/hub/models--Qwen/snapshots/0123abcd", "revision": "0123abcd", "shards": 39,
                          "bytes": 119 << 30, "config_sha256": "c" * 64}
    assert r["results"]["transports"] == {"0": "IB on spark-1", "1": "IB on spark-2"}
    assert r["results"]["kv_cache_tokens"] == 409856 and r["results"]["bringup_s"]["LOADING"] == 412.0
    assert r["good"] is True and r["verdict"] == "SERVING" and r["image"] == "vllm/vllm-openai:latest"
    assert json.loads(json.dumps(r)) == r  # JSON values only


def test_a_host_without_dgx_release_or_rdma_devices_says_none_and_one_not_read_unknown() -> None:
    r = build(sources(hosts={"spark-1": host("spark-1", dgx=NONE, rdma=False)}, gpus={}))
    assert r["nodes"]["spark-1"]["host"]["dgx"] == "none" and r["nodes"]["spark-1"]["fabric"]["rdma"] == "none"
    assert set(r["nodes"]["spark-2"]["host"].values()) == {"unknown"}  # not read: unknown, never "none"
    assert r["nodes"]["spark-2"]["fabric"]["rdma"] == r["nodes"]["spark-2"]["fabric"]["mtu"] == "unknown"
    assert r["nodes"]["spark-1"]["gpu"]["driver"] == "unknown"
    assert build(sources(transports=()))["results"]["transports"] == "unknown"  # none seen yet is not "none"


def test_the_image_facts_of_a_check_of_another_image_than_the_one_running_are_unknown() -> None:
    r = build(sources(running={"spark-1": B}))  # spark-1 runs B, its check was of A
    assert r["nodes"]["spark-1"]["image"]["id"] == B and r["nodes"]["spark-1"]["image"]["vllm"] == "unknown"
    assert r["nodes"]["spark-2"]["image"]["id"] == A  # not listed as running: the one its check inspected
    none = build(sources(images=checked(cfg(), repo_digests=())))  # an image built or imported here: no digest
    assert none["nodes"]["spark-1"]["image"]["digest"] == "none"


def secret_config() -> config.Config:
    d = data()
    dep = d["deployments"][0]
    dep["serve"]["env"] = {"HF_TOKEN": "hf_PLANTEDtoken123", "VLLM_LOGGING_LEVEL": "INFO"}
    dep["ray"] = {"env": {"NCCL_IB_GID_INDEX": "3", "RAY_REDIS_PASSWORD": "ray-PLANTED-pw"}}
    dep["readiness"] = {"api_key_env": "KEY"}
    return config.parse(with_image(d), "t.toml", env={"KEY": "sk-PLANTED-api-key"})


def test_the_serve_is_kept_by_its_argv_and_env_names_and_only_the_fabrics_values_redacted() -> None:
    c = secret_config()
    reason = "SanityFailed: 401 for Bearer sk-PLANTED-api-key"  # a reason that quotes the key
    r = build(sources(c, verdict="FAILED", reason=reason, decisions=(Decided(1.6e9, "repair serve", reason),)))
    text = json.dumps(r)
    for secret in ("sk-PLANTED-api-key", "hf_PLANTEDtoken123", "ray-PLANTED-pw"):
        assert secret not in text, secret
    s = r["serve"]
    assert {"HF_TOKEN", "VLLM_API_KEY", "VLLM_LOGGING_LEVEL", "NCCL_IB_GID_INDEX"} <= set(s["env"])
    fab = s["fabric_env"]["spark-2"]
    assert fab["NCCL_IB_GID_INDEX"] == "3" and fab["VLLM_HOST_IP"] == IPS["spark-2"]
    assert fab["RAY_REDIS_PASSWORD"] == "[redacted]" and "HF_TOKEN" not in fab and "VLLM_LOGGING_LEVEL" not in fab
    assert s["argv"][:2] == ["vllm", "serve"] and r["reason"] == "SanityFailed: 401 for Bearer [redacted]"
    assert r["decisions"][0]["reason"].endswith("[redacted]") and r["good"] is False


def test_a_serve_whose_verdict_is_a_regression_is_not_a_good_record() -> None:
    slow = PerfVerdict("serve-1", 10.0, 0.9, 13.1, regression="13.1 tok/s, best 27.4 for this spec")
    r = build(sources(perf=slow))
    assert r["good"] is False and r["results"]["performance"]["verdict"] == "regression"
    other = build(sources(perf=dataclasses.replace(slow, serve="another")))  # not this serve's
    assert other["good"] is True and other["results"]["performance"] == {"verdict": "unknown"}


# ---------------------------------------------------------------------------------------- diff and hint
def test_two_records_differ_field_by_field_and_what_was_not_read_is_no_change() -> None:
    old = build(sources())
    new = build(sources(hosts={"spark-1": host("spark-1"), "spark-2": host("spark-2", kernel="7.0.0-1019-nvidia")}))
    changes, unknown = diff(old, new)
    assert [str(c) for c in changes] == ["nodes.spark-2.host.kernel: 6.17.0-1032-nvidia → 7.0.0-1019-nvidia"]
    assert unknown == 0
    half = build(sources(hosts={"spark-1": host("spark-1")}))  # spark-2's host not read this time
    changes, unknown = diff(old, half)
    assert changes == [] and unknown == 13  # its host and fabric fields: unknown, not changed
    assert diff(old, old) == ([], 0)
    assert render_diff([], 0, old, old).endswith("\nno change")


def test_what_changed_names_the_facts_that_matter_first_and_at_most_three() -> None:
    good = build(sources())
    bad = build(sources(verdict="FAILED", running=dict.fromkeys(IPS, B), images=checked(cfg(), B, vllm_version="0.12.0"),
                        hosts={"spark-1": host("spark-1"), "spark-2": host("spark-2", kernel="7.0.0-1019-nvidia", mtu=1500)}))
    said = what_changed(good, bad)
    assert said == ("since the last good serve: kernel 6.17.0-1032-nvidia → 7.0.0-1019-nvidia on spark-2; image "
                    "sha256:aaaaaaaaaaaa… → sha256:bbbbbbbbbbbb…; vLLM 0.33.0 → 0.12.0; and 1 more "
                    "(spark-supervisor record --diff)"), said
    assert what_changed(None, bad) == ""  # no good serve to compare with: nothing said
    assert what_changed(good, good).endswith("nothing it records changed")


def test_a_member_added_is_one_change_of_the_members() -> None:
    old = build(sources())
    d = data()
    d["nodes"].append({**d["nodes"][1], "name": "spark-3", "fabric_ip": "192.168.200.14", "ssh": "root@spark-3",
                       "docker": "ssh://root@spark-3"})
    d["deployments"][0]["serve"]["tensor_parallel_size"] = 3
    new = build(sources(cfg(d)))
    changes, unknown = diff(old, new)
    assert [c.path for c in changes] == ["members", "serve.argv"] and unknown == 0  # its facts: in "members"
    assert str(changes[0]) == "members: spark-1, spark-2 → spark-1, spark-2, spark-3"


def test_a_record_reads_as_grouped_aligned_lines() -> None:
    r = build(sources(hosts={"spark-1": host("spark-1"), "spark-2": host("spark-2", kernel="7.0.0-1019-nvidia")}))
    lines = render(r).splitlines()
    assert lines[0].startswith("qwen: SERVING at 2023-11-14T22:13:20")
    assert "  kernel               6.17.0-1032-nvidia (spark-1) · 7.0.0-1019-nvidia (spark-2)" in lines
    assert "  driver               580.95.05" in lines  # said once: every member has it
    assert "  rdma rocep1s0f1/1    firmware 28.45.1200, state ACTIVE, rate_gbps 200.0, gid_index 3" in lines
    assert "image                  vllm/vllm-openai:latest" in lines and "  id                   sha256:aaaaaaaaaaaa…" in lines
    assert any(x.startswith("  argv                 vllm serve Qwen/Qwen3.5-122B-A10B-FP8 --host") for x in lines)


# --------------------------------------------------------------------------------------------- the store
def test_the_history_is_bounded_by_count_and_by_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = str(tmp_path)
    monkeypatch.setattr(records, "KEEP", 3)
    for i in range(5):
        records.append(d, {**build(sources(serve_id=f"s{i}")), "wall": float(i)}, float(i))
    h = records.read(d, "qwen")
    assert [r["serve_id"] for r in h.records] == ["s2", "s3", "s4"] and not h.problems
    size = len((tmp_path / records.HISTORY).read_bytes())
    monkeypatch.setattr(records, "MAX_BYTES", size - 1)  # one record less fits
    records.append(d, build(sources(serve_id="s5")), 6.0)
    assert [r["serve_id"] for r in records.read(d, "qwen").records] == ["s4", "s5"]
    assert os.stat(tmp_path / records.HISTORY).st_mode & 0o777 == 0o600


def test_a_corrupt_or_foreign_line_is_skipped_with_a_problem_and_set_aside_at_the_next_write(tmp_path: Path) -> None:
    d = str(tmp_path)
    records.append(d, build(sources(serve_id="s1")), 1.0)
    with open(tmp_path / records.HISTORY, "a") as f:
        f.write('{"cut": tr\n[1, 2]\n' + json.dumps({**build(sources()), "deployment": "other"}) + "\n")
    h = records.read(d, "qwen")
    assert [r["serve_id"] for r in h.records] == ["s1"]
    assert [p.split(": skipped: ")[1][:12] for p in h.problems] == ["not JSON (Ex", "not a JSON o", "of deploymen"]
    records.append(d, build(sources(serve_id="s2")), 2.0)
    assert [r["serve_id"] for r in records.read(d, "qwen").records] == ["s1", "s2"]
    assert len(list(tmp_path.glob(f"{records.HISTORY}.bad-*"))) == 1  # the damaged file kept for a look


def test_the_history_is_read_back_bounded_and_a_special_file_is_a_problem_not_a_hang(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = str(tmp_path)
    for i in range(3):
        records.append(d, build(sources(serve_id=f"s{i}")), float(i))
    line = len((tmp_path / records.HISTORY).read_bytes()) // 3
    monkeypatch.setattr(records, "MAX_BYTES", line + line // 2)  # grown past what is read: its end, whole lines
    h = records.read(d, "qwen")
    assert [r["serve_id"] for r in h.records] == ["s2"] and "only its end was read" in h.problems[0]
    (tmp_path / records.HISTORY).unlink()
    os.mkfifo(tmp_path / records.HISTORY)
    h = records.read(d, "qwen")
    assert h.records == [] and "is a FIFO" in h.problems[0]
    assert records.latest(str(tmp_path / "none"), "qwen").current is None  # none yet: nothing, no problem


def test_a_measured_verdict_is_added_to_its_serves_record_only(tmp_path: Path) -> None:
    d = str(tmp_path)
    records.append(d, build(sources(serve_id="s1")), 1.0)
    assert not records.amend(d, "qwen", "s0", {"good": False}, 2.0)
    assert records.amend(d, "qwen", "s1", {"good": False}, 2.0)
    assert records.read(d, "qwen").newest["good"] is False  # type: ignore[index]


def test_the_performance_is_compared_by_its_verdict_not_its_figures() -> None:
    ok = build(sources(perf=PerfVerdict("serve-1", 1.0, 0.2, 27.4)))
    faster = build(sources(perf=PerfVerdict("serve-1", 1.0, 0.1, 29.0), bringup={"LOADING": 380.0}))
    slow = build(sources(perf=PerfVerdict("serve-1", 1.0, 0.9, 13.1, regression="13.1 tok/s, best 27.4")))
    assert diff(ok, faster) == ([], 0)  # figures and timings move every time: not a change of what ran
    assert [str(c) for c in diff(ok, slow)[0]] == ["results.performance.verdict: ok → regression"]


def test_a_record_line_nested_too_deeply_or_mistyped_is_skipped_and_said_never_a_crash(tmp_path: Path) -> None:
    """Issue 42 (LOW): such a line gave a Traceback in `record`/`report` and stopped the daemon writing records."""
    from spark_supervisor.report.record.build import build
    from spark_supervisor.state import records
    rec = build(sources(serve_id="s1"))
    name = rec["deployment"]
    deep = "[" * 100_000 + "]" * 100_000
    mistyped = json.dumps({**rec, "decisions": 5})
    (tmp_path / records.HISTORY).write_text(f"{deep}\n{mistyped}\n{json.dumps(rec)}\n")
    h = records.read(str(tmp_path), name)
    assert [r["serve_id"] for r in h.records] == ["s1"]
    assert [p.split(": skipped: ")[1] for p in h.problems] == ["nested too deeply to be a record",
                                                              "its decisions are not a list"]
    h = records.append(str(tmp_path), {**rec, "serve_id": "s2"}, 2.0)  # the daemon goes on writing records
    assert [r["serve_id"] for r in records.read(str(tmp_path), name).records] == ["s1", "s2"]
