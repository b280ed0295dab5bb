"""The model check: the probe (run here with this Python, as the image's would run it) on every shape of a
model directory and of the Hugging Face cache, the judgment, the reason and its hint, the planner's step
and the prefetch program (a copy from a local directory)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spark_supervisor import config
from spark_supervisor.config import OWNER_LABEL, ROLE_LABEL
from spark_supervisor.judge import modelcheck
from spark_supervisor.model import (
    CheckImage,
    CheckModel,
    Container,
    ContainerSpec,
    ModelReport,
    Phase,
    PrefetchModel,
    RayObservation,
    Reason,
    StartContainer,
    StartServe,
    Status,
)
from spark_supervisor.plan import plan
from spark_supervisor.specs import commands, modelprobe
from spark_supervisor.state import modelchecks
from tests.helpers import cfg, counted, data, images, node_obs, obs, ray_ok, view_of

REPO = "Org/Tiny-Model"
SHARDS = ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"]


# ------------------------------------------------------------------------------------------- fixtures
def write_model(d: Path, *, shards: list[str] = SHARDS, size: int = 100, index: bool = True,
                config_json: bool = True, total: int | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    if config_json:
        (d / "config.json").write_text('{"model_type": "qwen3"}')
    for s in shards:
        (d / s).write_bytes(b"x" * size)
    if index:
        wm = {f"layer.{i}.weight": s for i, s in enumerate(shards)}
        meta = {"total_size": total if total is not None else len(shards) * (size - 8)}
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": meta, "weight_map": wm}))
    return d


def write_hub(cache: Path, repo: str = REPO, *, rev: str = "a" * 40, ref: bool = True, **kw: Any) -> Path:
    """The hub cache's layout: files in blobs/, snapshots/<rev>/ of links to them, refs/main -> rev."""
    root = cache / ("models--" + repo.replace("/", "--"))
    staged = write_model(root / "staging", **kw)
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    snap = root / "snapshots" / rev
    snap.mkdir(parents=True)
    for f in sorted(staged.iterdir()):
        blob = root / "blobs" / f"blob-{f.name}"
        f.rename(blob)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    staged.rmdir()
    if ref:
        (root / "refs").mkdir(exist_ok=True)
        (root / "refs" / "main").write_text(rev)
    return snap


def probe(model: str, env: dict[str, str] | None = None, extra: list[str] | None = None,
          cwd: Path | None = None) -> ModelReport:
    """PROBE_PY through RUN_PY, as in the container (this Python stands for the image's vLLM)."""
    dep = config.parse(data(deployments=[{"name": "m", "serve": {"model": model, "extra_args": extra or [],
                                                                 "tensor_parallel_size": 2}}]),
                       "t.toml", env={}).deployment
    r = subprocess.run(["sh", "-c", modelprobe.RUN_PY, "spark-model-probe", sys.executable, modelprobe.PROBE_PY,
                        *modelprobe.probe_args(dep)], capture_output=True, text=True, timeout=60,
                       env={"PATH": os.environ["PATH"], "HOME": "/nonexistent", **(env or {})}, cwd=cwd)
    assert r.returncode == 0, r.stderr
    return modelcheck.judge("spark-2", model, "k", modelcheck.parse(r.stdout))


# ------------------------------------------------------------------------------------ the probe + judge
def test_a_complete_local_directory(tmp_path: Path) -> None:
    d = write_model(tmp_path / "m")
    r = probe(str(d))
    assert r.missing == () and r.path == str(d) and r.source == "local" and (r.files, r.bytes) == (3, 300)
    assert r.summary() == f"{d}: 3 weight files, 300 B"


@pytest.mark.parametrize("shape, want", [
    (dict(config_json=False), "config.json"),
    (dict(index=False, shards=[]), "model.safetensors (no weights index, no weight files)"),
    (dict(shards=SHARDS, size=0), f"{SHARDS[0]} (0 bytes)"),
    (dict(total=10_000), "less than the index's total_size 10,000 (truncated)"),
])
def test_an_incomplete_local_directory_names_what_is_missing(tmp_path: Path, shape: dict[str, Any], want: str) -> None:
    r = probe(str(write_model(tmp_path / "m", **shape)))
    assert any(m.endswith(want) for m in r.missing), r.missing


def test_a_shard_named_by_the_index_that_is_not_there(tmp_path: Path) -> None:
    d = write_model(tmp_path / "m")
    (d / SHARDS[1]).unlink()
    r = probe(str(d))
    assert r.missing == (SHARDS[1],) and r.files == 2


def test_an_unreadable_index(tmp_path: Path) -> None:
    d = write_model(tmp_path / "m")
    (d / "model.safetensors.index.json").write_text('{"weight_map": ')
    assert probe(str(d)).missing[0].startswith("model.safetensors.index.json (unreadable: JSONDecodeError")


def test_a_single_file_model_without_index(tmp_path: Path) -> None:
    d = write_model(tmp_path / "m", shards=["model.safetensors"], index=False)
    assert probe(str(d)).missing == ()
    (d / "model.safetensors").write_bytes(b"")
    assert probe(str(d)).missing == ("model.safetensors (0 bytes)",)


def test_a_local_path_that_does_not_exist(tmp_path: Path) -> None:
    r = probe(str(tmp_path / "nope"))
    assert r.missing == (f"{tmp_path / 'nope'} (no such directory)",) and r.source == "local"


def test_a_hub_id_in_the_cache_under_hf_home(tmp_path: Path) -> None:
    snap = write_hub(tmp_path / "hf" / "hub")
    r = probe(REPO, {"HF_HOME": str(tmp_path / "hf")})
    assert r.missing == () and r.path == str(snap) and r.source == "hub" and r.files == 3
    assert r.cache == str(tmp_path / "hf" / "hub")


def test_hub_cache_variables_and_download_dir_as_huggingface_hub_reads_them(tmp_path: Path) -> None:
    write_hub(tmp_path / "c1")
    assert probe(REPO, {"HF_HUB_CACHE": str(tmp_path / "c1"), "HF_HOME": "/x"}).missing == ()
    write_hub(tmp_path / "home" / ".cache" / "huggingface" / "hub")
    assert probe(REPO, {"HOME": str(tmp_path / "home")}).missing == ()  # the default ~/.cache/huggingface
    write_hub(tmp_path / "dl", rev="b" * 40)
    assert probe(REPO, extra=["--download-dir", str(tmp_path / "dl")]).path.endswith("b" * 40)


def test_a_dangling_link_into_blobs_is_missing(tmp_path: Path) -> None:
    write_hub(tmp_path / "hub")
    blob = tmp_path / "hub" / f"models--{REPO.replace('/', '--')}" / "blobs" / f"blob-{SHARDS[2]}"
    blob.unlink()  # an interrupted download: the snapshot's link is there, its blob is not
    r = probe(REPO, {"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert r.missing == (f"{SHARDS[2]} (dangling link)",)


def test_snapshots_without_refs_main(tmp_path: Path) -> None:
    write_hub(tmp_path / "hub", ref=False)
    assert probe(REPO, {"HF_HUB_CACHE": str(tmp_path / "hub")}).missing == ()  # the only snapshot
    write_hub(tmp_path / "hub2", ref=False)
    (tmp_path / "hub2" / f"models--{REPO.replace('/', '--')}" / "snapshots" / ("c" * 40)).mkdir()
    r = probe(REPO, {"HF_HUB_CACHE": str(tmp_path / "hub2")})
    assert r.missing == (f"models--{REPO.replace('/', '--')}/refs/main (and 2 snapshots: which one?)",)


def test_a_hub_id_not_in_the_cache(tmp_path: Path) -> None:
    r = probe(REPO, {"HF_HUB_CACHE": str(tmp_path / "empty")})
    assert r.missing == (f"{REPO} is not in the hub cache {tmp_path / 'empty'} (no models--Org--Tiny-Model/snapshots)",)


def test_an_image_without_python_is_not_checked_and_an_odd_answer_is_an_error() -> None:
    r = modelcheck.judge("n", "m", "k", modelcheck.parse("spark-model: no-python\n"))
    assert r.unchecked and not r.missing
    for out in ("", "spark-model: {broken", 'spark-model: {"source": "elsewhere"}'):
        with pytest.raises(modelcheck.ProbeError):
            modelcheck.parse(out)


# ------------------------------------------------------------------------------------- reason and hint
def hub_cfg(**model: Any) -> config.Config:
    d = data()
    d["deployments"][0]["ray"] = {"volumes": ["/data/hf:/root/.cache/huggingface"]}
    d["deployments"][0]["model"] = model
    return cfg(d)


def test_the_reason_names_node_files_and_the_download_to_run_on_the_host_path() -> None:
    c = hub_cfg()
    missing = tuple(f"model-0000{i}.safetensors" for i in range(1, 6))
    reports = {"spark-1": ModelReport("spark-1", REPO, "k", path="/root/.cache/huggingface/hub/x", source="hub"),
               "spark-2": ModelReport("spark-2", REPO, "k", path="/root/.cache/huggingface/hub/x", source="hub",
                                      cache="/root/.cache/huggingface/hub", missing=missing)}
    found = modelcheck.problem(c, c.deployment, reports)
    assert found is not None
    kind, detail = found
    assert kind == "ModelMissing"
    assert "spark-2: model-00001.safetensors, model-00002.safetensors, model-00003.safetensors and 2 more" in detail
    assert "spark-1:" not in detail.split("Hint")[0]
    assert f"on spark-2 run `hf download {c.deployment.serve.model} --cache-dir /data/hf/hub`" in detail
    assert "prefetch = true" in detail


def test_a_local_path_hint_copies_from_a_node_that_has_it() -> None:
    d = data()
    d["deployments"][0]["serve"]["model"] = "/models/tiny"
    d["deployments"][0]["ray"] = {"volumes": ["/srv/models:/models:ro"]}
    c = cfg(d)
    reports = {"spark-1": ModelReport("spark-1", "/models/tiny", "k", path="/models/tiny", source="local", files=3),
               "spark-2": ModelReport("spark-2", "/models/tiny", "k", path="/models/tiny", source="local",
                                      missing=("config.json",))}
    detail = modelcheck.describe(c, c.deployment, reports)
    assert "on spark-2 run `rsync -a spark-1:/srv/models/tiny/ /srv/models/tiny/`" in detail
    assert modelcheck.host_path(c.deployment, "/elsewhere") == ""


# ---------------------------------------------------------------------------------------- the planner
C = hub_cfg()
P = hub_cfg(prefetch=True, prefetch_from="/root/.cache/huggingface/src")
KEY = modelprobe.key(C, C.deployment)


def checked(c: config.Config, **per_node: ModelReport) -> Status:
    key = modelprobe.key(c, c.deployment)
    reports = {n: dataclasses.replace(r, model=per_node.get(n, ModelReport(n, REPO, key, path="/p", files=1)))
               for n, r in images(c).items()}
    return Status(images=reports)


def missing(node: str, c: config.Config = C, **kw: Any) -> ModelReport:
    return ModelReport(node, REPO, modelprobe.key(c, c.deployment), path="/p/snap", source="hub",
                       cache="/root/.cache/huggingface/hub", missing=("model-00002-of-00003.safetensors",), **kw)


def test_a_complete_model_everywhere_starts_and_an_unchecked_one_is_no_evidence() -> None:
    assert plan(obs(C), checked(C), view_of(C), 100).actions == (StartContainer("spark-1"), StartContainer("spark-2"))
    assert plan(obs(C), Status(images=images(C)), view_of(C), 100).actions[0] == StartContainer("spark-1")  # model None


def test_missing_on_one_node_is_failed_before_anything_starts_with_no_budget_spent() -> None:
    d = plan(obs(C), checked(C, **{"spark-2": missing("spark-2")}), view_of(C), 100)
    assert d.phase == Phase.FAILED and d.fatal and not d.repair and d.actions == ()
    assert d.why.kind == "ModelMissing" and "spark-2: model-00002-of-00003.safetensors" in d.why.detail
    off = hub_cfg(check=False)
    assert plan(obs(off), checked(off, **{"spark-2": missing("spark-2", off)}), view_of(off), 100).actions[0] == \
        StartContainer("spark-1")


def test_prefetch_runs_once_is_watched_then_rechecked() -> None:
    d = plan(obs(P), checked(P, **{"spark-2": missing("spark-2", P)}), view_of(P), 100)
    assert d.actions == (PrefetchModel("spark-2"),) and d.phase == Phase.DETECTING
    assert d.why == Reason("PrefetchingModel", f"{P.deployment.serve.model} on spark-2 from /root/.cache/huggingface/src")
    running = ModelReport("spark-2", REPO, modelprobe.key(P, P.deployment), prefetch="running", prefetched=True,
                          bytes_done=2**30, bytes_total=2**31, files_done=1, files_total=3, path="/p/snap")
    d = plan(obs(P), checked(P, **{"spark-2": running}), view_of(P), 100)
    assert d.actions == (CheckImage("spark-2"),) and d.why.kind == "PrefetchingModel"
    assert running.summary() == "prefetching into /p/snap: 1/3 files, 1.0 GiB of 2.0 GiB"
    after = missing("spark-2", P, prefetched=True, detail="OSError: no space left on device")
    d = plan(obs(P), checked(P, **{"spark-2": after}), view_of(P), 100)
    assert d.phase == Phase.FAILED and "the prefetch did not complete it (spark-2: OSError: no space" in d.why.detail


def test_a_model_changed_under_running_containers_is_checked_before_the_launch() -> None:
    st = checked(C, **{"spark-2": dataclasses.replace(missing("spark-2"), key="old", missing=())})
    st.advance(Phase.STARTING_VLLM, Reason(), 0, 0)
    d = plan(obs(C, deployed=True, ray=ray_ok(C)), st, view_of(C), 100)
    assert d.actions == (CheckImage("spark-2"),) and d.why.kind == "CheckingModel"
    st.images["spark-2"] = dataclasses.replace(st.images["spark-2"], model=ModelReport("spark-2", REPO, KEY, path="/p"))
    assert plan(obs(C, deployed=True, ray=ray_ok(C)), st, view_of(C), 100).actions == (StartServe(),)


def later(**per_node: ModelReport) -> Status:
    """Images checked with the model put off to the Ray join (complete at each node's last check); a node in
    ``per_node`` has its put-off check made, with that report."""
    return Status(images={n: dataclasses.replace(r, model_later=True, model=per_node.get(n))
                          for n, r in images(C).items()})


def forming(c: config.Config = C) -> RayObservation:
    return RayObservation(True, nodes=ray_ok(c).nodes[:1])  # the head alive, the worker not yet


def test_a_model_complete_at_its_last_check_is_checked_while_ray_joins_not_before_the_start() -> None:
    st = later()
    assert plan(obs(C), st, view_of(C), 100).actions == (StartContainer("spark-1"), StartContainer("spark-2"))
    st.advance(Phase.STARTING_RAY, Reason(), 100, 100)
    d = plan(obs(C, deployed=True, ray=forming(), full=False), st, view_of(C), 101)
    assert d.actions == (CheckModel("spark-1"), CheckModel("spark-2")) and d.phase == Phase.STARTING_RAY
    assert d.why.kind == "CheckingModel" and not d.repair
    done = later(**{n: ModelReport(n, REPO, KEY, path="/p", files=1) for n in ("spark-1", "spark-2")})
    done.advance(Phase.STARTING_RAY, Reason(), 100, 100)
    d = plan(obs(C, deployed=True, ray=forming(), full=False), done, view_of(C), 102)
    assert d.actions == () and d.phase == Phase.STARTING_RAY and d.why.detail.startswith("1/2 nodes")


def test_a_put_off_check_not_made_when_ray_formed_is_made_before_the_launch() -> None:
    st = later(**{"spark-1": ModelReport("spark-1", REPO, KEY, path="/p", files=1)})
    st.advance(Phase.STARTING_VLLM, Reason(), 100, 100)
    d = plan(obs(C, deployed=True, ray=ray_ok(C)), st, view_of(C), 101)
    assert d.actions == (CheckModel("spark-2"),) and d.phase == Phase.STARTING_VLLM and d.why.kind == "CheckingModel"


def test_a_model_gone_since_its_last_check_takes_the_containers_down_then_fails_before_a_start() -> None:
    st = later(**{"spark-1": ModelReport("spark-1", REPO, KEY, path="/p", files=1), "spark-2": missing("spark-2")})
    st.advance(Phase.STARTING_RAY, Reason(), 100, 100)
    d = plan(obs(C, deployed=True, ray=forming(), full=False), st, view_of(C), 101)
    assert d.phase == Phase.CLEANING and d.why.kind == "ModelMissing" and not d.repair and not d.fatal
    assert {type(a).__name__ for a in d.actions} == {"RemoveContainers"}
    d = plan(obs(C), st, view_of(C), 102)  # the containers gone: the report found is the evidence, as before any start
    assert d.phase == Phase.FAILED and d.fatal and d.why.kind == "ModelMissing" and d.actions == ()


def test_the_prefetch_container_is_ours_but_not_a_node_of_the_deployment() -> None:
    pre = Container("p1", commands.prefetch_name(P.deployment, P.nodes[1]), "img", "running",
                    {OWNER_LABEL: P.deployment.name, ROLE_LABEL: commands.PREFETCH_ROLE})
    o = obs(P, nodes={"spark-1": node_obs("spark-1"), "spark-2": node_obs("spark-2", (pre,))})
    running = ModelReport("spark-2", REPO, modelprobe.key(P, P.deployment), prefetch="running", prefetched=True)
    d = plan(o, checked(P, **{"spark-2": running}), view_of(P), 100)
    assert d.actions == (CheckImage("spark-2"),) and not d.repair


# ------------------------------------------------------------------------------------ config, commands
def test_prefetch_settings_are_validated() -> None:
    def err(model: dict[str, Any]) -> str:
        d = data()
        d["deployments"][0]["model"] = model
        with pytest.raises(config.ConfigError) as e:
            cfg(d)
        return "\n".join(e.value.problems)
    assert "deployments[0].model.prefetch_from" in err({"prefetch_from": "/x"})
    assert "is only used with prefetch = true" in err({"prefetch_from": "/x"})
    assert "is on none of deployments.ray.volumes" in err({"prefetch": True, "prefetch_from": "/src"})
    assert "needs check = true" in err({"prefetch": True, "check": False})
    assert "must be an absolute" in err({"prefetch": True, "prefetch_from": "src"}) or "absolute" in err(
        {"prefetch": True, "prefetch_from": "src"})
    assert P.deployment.model.prefetch_from == "/root/.cache/huggingface/src"


def test_the_probe_and_the_prefetch_run_in_the_image_with_the_node_containers_mounts_and_env() -> None:
    dep, node = P.deployment, P.nodes[1]
    base = commands.node_container(P, dep, node)
    spec = commands.model_probe(P, dep, node)
    # the node container's mounts, each read-only (a probe reads: issue 42, item 4); the prefetch writes
    assert spec.image == base.image and spec.options["volumes"] == {
        src: {**v, "mode": "ro"} for src, v in base.options["volumes"].items()}
    assert spec.options["network_mode"] == "none" and spec.environment == {**base.environment, **dep.serve.env}
    assert spec.command[-3:] == [dep.serve.model, "", ""]
    pre = commands.model_prefetch(P, dep, node)
    assert pre.name == f"{dep.name}-model-spark-2" and pre.labels[OWNER_LABEL] == dep.name
    assert pre.options["volumes"] == base.options["volumes"]
    assert pre.command[-4:-2] == ["/root/.cache/huggingface/src", "21600"]


# --------------------------------------------------------------------------------------- the prefetch
def test_the_prefetch_copies_a_local_directory_into_the_hub_cache_and_the_probe_then_finds_it(tmp_path: Path) -> None:
    src = write_model(tmp_path / "src")
    progress = tmp_path / "progress.json"
    env = {"PATH": os.environ["PATH"], "HF_HUB_CACHE": str(tmp_path / "hub")}
    r = subprocess.run(["sh", "-c", modelprobe.RUN_PY, "p", sys.executable, modelprobe.PREFETCH_PY, REPO, "", "",
                        str(src), "60", "0", str(progress)], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    p = json.loads(progress.read_text())
    assert p["state"] == "done" and p["files_done"] == p["files_total"] == 5 and p["bytes_done"] == p["bytes_total"]
    assert probe(REPO, {"HF_HUB_CACHE": str(tmp_path / "hub")}).missing == ()
    # into a cache that has the snapshot with one shard's blob gone: only that one is copied
    snap = write_hub(tmp_path / "hub2")
    (snap / SHARDS[0]).resolve().unlink()
    subprocess.run(["sh", "-c", modelprobe.RUN_PY, "p", sys.executable, modelprobe.PREFETCH_PY, REPO, "", "",
                    str(src), "60", "0", str(progress)], check=True, timeout=60,
                   env={**env, "HF_HUB_CACHE": str(tmp_path / "hub2")})
    p = json.loads(progress.read_text())
    assert p["state"] == "done" and p["bytes_done"] == p["bytes_total"] and p["target"] == str(snap)
    assert probe(REPO, {"HF_HUB_CACHE": str(tmp_path / "hub2")}).missing == ()


def test_a_finished_prefetch_waits_to_be_read_and_ends_at_once_when_stopped(tmp_path: Path) -> None:
    from spark_testbed.testbed import until
    progress = tmp_path / "progress.json"
    p = subprocess.Popen(["sh", "-c", modelprobe.RUN_PY, "p", sys.executable, modelprobe.PREFETCH_PY, "/models/x", "",
                          "", str(tmp_path / "nope"), "60", "600", str(progress)])
    try:
        def failed() -> bool:
            try:
                return bool(json.loads(progress.read_text())["state"] == "failed")
            except (OSError, ValueError):  # not written yet, or caught mid-write
                return False
        until(failed, 60, "its result")
        assert p.poll() is None  # kept for the daemon to read
        p.terminate()  # what `docker stop` sends
        assert p.wait(timeout=30) == 0
    finally:
        p.kill()
        p.wait()


def test_a_prefetch_from_a_directory_that_is_not_there_fails_with_why(tmp_path: Path) -> None:
    progress = tmp_path / "progress.json"
    subprocess.run(["sh", "-c", modelprobe.RUN_PY, "p", sys.executable, modelprobe.PREFETCH_PY, "/models/x", "", "",
                    str(tmp_path / "nope"), "60", "0", str(progress)], check=True, timeout=60)
    p = json.loads(progress.read_text())
    assert p["state"] == "failed" and "is not a directory in the image" in p["error"]


def test_a_hub_prefetch_that_cannot_download_fails_with_why(tmp_path: Path) -> None:
    progress = tmp_path / "progress.json"
    env = {"PATH": os.environ["PATH"], "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    subprocess.run(["sh", "-c", modelprobe.RUN_PY, "p", sys.executable, modelprobe.PREFETCH_PY, REPO, "", "", "",
                    "60", "0", str(progress)], check=True, timeout=60, env=env)
    p = json.loads(progress.read_text())  # no huggingface_hub here, or offline: either way it says why
    assert p["state"] == "failed" and p["source"] == "hub" and p["error"], p


def test_a_prefetch_that_would_not_fit_on_the_disk_copies_nothing_and_says_why(tmp_path: Path) -> None:
    src = write_model(tmp_path / "src")
    st = os.statvfs(tmp_path)
    with open(src / "huge.bin", "wb") as f:  # sparse: as large as the disk has room for, and a GiB more
        f.truncate(st.f_bavail * st.f_frsize + (1 << 30))
    progress, hub = tmp_path / "progress.json", tmp_path / "hub"
    subprocess.run(["sh", "-c", modelprobe.RUN_PY, "p", sys.executable, modelprobe.PREFETCH_PY, REPO, "", "",
                    str(src), "3", "0", str(progress)], check=True, timeout=60,  # a copy it wrongly starts ends soon
                   env={"PATH": os.environ["PATH"], "HF_HUB_CACHE": str(hub)})
    p = json.loads(progress.read_text())
    assert p["state"] == "failed" and p["error"].startswith("OSError: no room in ") and " free" in p["error"], p
    assert p["bytes_done"] == 0 and not [f for f in hub.rglob("*") if f.is_file() and f.name != "main"]


# ---------------------------------------------------------------------------- what the last check found
def test_the_last_checks_finding_is_kept_per_node_and_key_written_only_when_it_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_supervisor.state import statefile
    sd = str(tmp_path)
    statefile.update_node(sd, "spark-1", image_id="sha256:i", key="r")  # the image's check, kept beside it
    writes = counted(monkeypatch, statefile, "write_json")
    kept = modelchecks.Kept(sd)
    assert not kept.complete("spark-1", "k1")
    kept.note("spark-1", "k1", True)
    kept.note("spark-1", "k1", True)  # the same finding again: not written
    assert kept.complete("spark-1", "k1") and len(writes) == 1
    assert not kept.complete("spark-2", "k1") and not kept.complete("spark-1", "k2")
    assert modelchecks.Kept(sd).complete("spark-1", "k1")  # a restarted daemon reads it
    assert statefile.read_node(sd, "spark-1")["image_id"] == "sha256:i"  # the image's check kept
    kept.note("spark-1", "k1", False)  # found incomplete since: the next start checks before it starts
    assert not kept.complete("spark-1", "k1") and len(writes) == 2
    for i in range(20):
        kept.note("spark-1", f"k{i}", True)
    models = statefile.read_node(sd, "spark-1")["models"]
    assert len(models) == modelchecks.Kept.KEYS and "k19" in models and "k0" not in models
    (tmp_path / statefile.NODES).write_text("[not an object")  # damaged: no evidence, checked before the start
    assert not modelchecks.Kept(sd).complete("spark-1", "k19")


def test_two_keepers_of_one_directory_each_write_only_their_own_finding(tmp_path: Path) -> None:
    """The daemon's and a change's proof's: what one found is not written over by the other's older view."""
    from spark_supervisor.state import statefile
    sd = str(tmp_path)
    daemon, proof = modelchecks.Kept(sd), modelchecks.Kept(sd)
    assert not daemon.complete("spark-1", "old") and not proof.complete("spark-1", "new")  # both read the file
    daemon.note("spark-1", "old", True)
    proof.note("spark-1", "new", True)
    assert set(statefile.read_node(sd, "spark-1")["models"]) == {"old", "new"}
    daemon.note("spark-1", "old", False)
    proof.note("spark-1", "other", True)
    assert set(statefile.read_node(sd, "spark-1")["models"]) == {"new", "other"}
    daemon.note("spark-1", "new", False)  # found gone since the proof found it: the file says so, whatever it held
    assert set(statefile.read_node(sd, "spark-1")["models"]) == {"other"}


def test_a_finding_that_could_not_be_written_is_kept_all_the_same(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found gone while Ray joined, and the file not writable: the next start checks before it starts, not
    put off again on the file's word into a loop of starts."""
    from spark_supervisor.state import statefile
    sd = str(tmp_path)
    modelchecks.Kept(sd).note("spark-2", "k", True)
    kept = modelchecks.Kept(sd)
    assert kept.complete("spark-2", "k")

    def full(*_: Any) -> None:
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(statefile, "write_json", full)
    with pytest.raises(OSError):
        kept.note("spark-2", "k", False)
    assert not kept.complete("spark-2", "k")
    assert modelchecks.Kept(sd).complete("spark-2", "k")  # the file still says so: only a saving lost


def test_an_image_check_puts_the_model_check_off_only_when_asked_and_the_last_one_found_it_complete(
        tmp_path: Path) -> None:
    import structlog

    from spark_supervisor.world.act import Actor
    from spark_supervisor.world.observe import World
    d = data()
    d["supervisor"]["state_dir"] = str(tmp_path)
    c = cfg(d)
    actor = Actor(World(view_of(c)), structlog.get_logger())
    made: list[str] = []
    actor._check_image = lambda a, **_: images(c)[a.node.name]  # type: ignore[method-assign]

    def check_model(a: Any) -> ModelReport:
        made.append(a.node.name)
        return ModelReport(a.node.name, "m", "k")
    actor._check_model = check_model  # type: ignore[method-assign]
    a = actor.world.nodes["spark-2"]
    key = modelprobe.key(c, c.deployment)
    assert actor._check(a, model_later=True).model is not None and made == ["spark-2"]  # no finding kept yet
    actor.models.note("spark-2", key, True)
    r = actor._check(a, model_later=True)
    assert r.model is None and r.model_later and made == ["spark-2"]
    assert actor._check(a, model_later=False).model is not None and made == ["spark-2", "spark-2"]  # a proof's


def test_a_start_failing_on_one_node_checks_the_nodes_put_off_first_so_the_failure_names_every_node() -> None:
    st = later(**{"spark-2": missing("spark-2")})
    d = plan(obs(C), st, view_of(C), 100)
    assert d.actions == (CheckModel("spark-1"),) and d.phase == Phase.DETECTING
    st.images["spark-1"] = dataclasses.replace(st.images["spark-1"], model=ModelReport("spark-1", REPO, KEY, path="/p"))
    d = plan(obs(C), st, view_of(C), 101)
    assert d.phase == Phase.FAILED and d.why.kind == "ModelMissing" and d.actions == ()


def test_a_start_whose_checks_were_forgotten_checks_before_the_launch() -> None:
    """A reset, a reload or a daemon restarted mid-start leaves no reports: the launch waits for checks made
    now, never goes on with the model unchecked."""
    st = Status()
    st.advance(Phase.STARTING_RAY, Reason(), 100, 100)
    d = plan(obs(C, deployed=True, ray=forming(), full=False), st, view_of(C), 101)
    assert d.actions == (CheckImage("spark-1"), CheckImage("spark-2")) and d.why.kind == "CheckingModel"
    st.advance(Phase.STARTING_VLLM, Reason(), 102, 102)
    d = plan(obs(C, deployed=True, ray=ray_ok(C)), st, view_of(C), 103)
    assert d.actions == (CheckImage("spark-1"), CheckImage("spark-2")) and d.phase == Phase.STARTING_VLLM


def test_every_start_asks_for_the_model_check_to_wait_and_the_actor_decides() -> None:
    """The planner lets every start's image check put the model check off; the actor alone decides, on what
    each node's last check found (modelchecks.Kept): a model found gone while Ray joined is checked first."""
    st = later(**{"spark-2": missing("spark-2")})  # found gone while Ray joined
    st.starts = 1  # the containers went: the next start checks its images again
    d = plan(obs(C), st, view_of(C), 100)
    assert d.actions == (CheckImage("spark-1", model_later=True), CheckImage("spark-2", model_later=True))


def test_the_image_and_model_checks_in_one_container_read_as_the_two_apart(tmp_path: Path) -> None:
    """A first start (or a new image) makes both checks in one container (commands.checks_probe): run here by a
    real sh, as the container would, its output split (commands.split_checks) reads as the two probes' own."""
    from spark_supervisor.judge.preflight import parse_image_probe
    from spark_supervisor.specs import commands
    d = write_model(tmp_path / "m")
    dep = config.parse(data(deployments=[{"name": "m", "serve": {"model": str(d), "tensor_parallel_size": 2,
                                                                 "command": [sys.executable, "-m", "vllm"]},
                                          "ray": {"command": [str(Path(sys.executable).parent / "ray"), "start"]}}]),
                       "t.toml", env={}).deployment
    c = cfg(data(deployments=[{"name": "m", "serve": {"model": str(d), "tensor_parallel_size": 2}}]))
    env = {"PATH": os.environ["PATH"], "HOME": "/nonexistent"}

    def run(spec: ContainerSpec) -> tuple[int, str]:
        r = subprocess.run(spec.command, capture_output=True, text=True, timeout=120, env=env)
        return r.returncode, r.stdout + r.stderr
    node = c.nodes[1]
    image_code, image_out = run(commands.image_probe(c, dep, node))
    model_code, model_out = run(commands.model_probe(c, dep, node))
    code, out = run(commands.checks_probe(c, dep, node))
    got_code, got_image, got_model = commands.split_checks(code, out)
    assert (got_code, code) == (image_code, model_code) == (0, 0), out
    assert parse_image_probe("n", "i", "k", got_image) == parse_image_probe("n", "i", "k", image_out)
    assert parse_image_probe("n", "i", "k", got_image).ray_version  # something was read
    assert modelcheck.parse(got_model) == modelcheck.parse(model_out)
    assert modelcheck.judge("n", str(d), "k", modelcheck.parse(got_model)).files == 3
    assert commands.checks_probe(c, dep, node).environment == commands.model_probe(c, dep, node).environment
    # an image that cannot run the image probe: its code, not the model's; no mark at all: the container's
    assert commands.split_checks(0, "x\nspark-checks: image exit 127\ny") == (127, "x\n", "y")
    assert commands.split_checks(126, "sh: not found") == (126, "sh: not found", "")


def test_a_first_start_checks_the_image_and_the_model_in_one_container_and_a_later_one_in_none(
        tmp_path: Path) -> None:
    """Nothing kept yet (a new state directory, a new image): both checks in one short-lived container. The next
    start finds the image's check kept by its ID and the model complete at its last check: no container at all
    before the start (the model is checked while Ray joins). A proof checks the model, in its own container."""
    import structlog

    from spark_supervisor.model import ImageReport
    from spark_supervisor.specs import commands
    from spark_supervisor.world.act import Actor
    from tests.fakes import fake_world
    d = write_model(tmp_path / "m")
    data_ = data()
    data_["supervisor"]["state_dir"] = str(tmp_path / "state")
    data_["deployments"][0]["serve"]["model"] = str(d)
    c = cfg(data_)
    model_out = subprocess.run(commands.model_probe(c, c.deployment, c.nodes[1]).command[:4] + [
        sys.executable, modelprobe.PROBE_PY, *modelprobe.probe_args(c.deployment)], capture_output=True, text=True,
        timeout=60, env={"PATH": os.environ["PATH"], "HOME": "/nonexistent"}).stdout
    world, engines, _ = fake_world(c)
    try:
        actor, e = Actor(world, structlog.get_logger()), engines["spark-2"]
        e.once = (0, "ray_path=/usr/bin/ray\nray_version=2.60.0\nray_dashboard=yes\nvllm_path=/usr/bin/vllm\n"
                     "vllm_version=0.33.0\n" + commands.CHECKS_MARK + "0\n" + model_out)
        r = actor.run(CheckImage("spark-2", model_later=True))
        assert isinstance(r, ImageReport) and r.ray_version == "2.60.0" and r.model is not None
        assert r.model.files == 3 and not r.model.missing and not r.model_later
        assert [s.command[2] for s in e.ran_once] == [commands.CHECKS]  # one container, both checks
        assert e.once_timeouts == [world.view.deadlines.checks.seconds]  # each probe its own time, as in two
        r = actor.run(CheckImage("spark-2", model_later=True))  # the next start
        assert isinstance(r, ImageReport) and r.model is None and r.model_later and len(e.ran_once) == 1
        e.once = (0, model_out)
        r = actor.run(CheckImage("spark-2"))  # a proof's
        assert isinstance(r, ImageReport) and r.model is not None and r.model.files == 3
        assert [s.command[2] for s in e.ran_once[1:]] == [modelprobe.RUN_PY]  # the model's own container
    finally:
        world.close()


def test_the_image_probes_exit_is_read_after_output_that_does_not_end_its_line() -> None:
    from spark_supervisor.specs import commands
    image = 'printf "ray_path=/r"; exit 3'  # what an image's odd shell could leave: no newline at the end
    r = subprocess.run(["sh", "-c", commands.CHECKS, "spark-checks", image, "n", "", "", "",
                        "echo model", "m"], capture_output=True, text=True, timeout=30)
    assert commands.split_checks(r.returncode, r.stdout) == (3, "ray_path=/r\n", "model\n")


def test_the_probe_measures_the_disks_sequential_read_under_a_real_sized_shard(tmp_path: Path) -> None:
    """judge.loadrate judges a load against it: O_DIRECT reads of the largest weight file (this machine's ext4);
    a model too small to time says nothing rather than a figure from a few KiB."""
    d = write_model(tmp_path / "m", shards=["model-00001-of-00001.safetensors"], size=100)
    assert probe(str(d)).disk_gb_s is None  # 100 bytes: not measured
    with open(d / "model-00001-of-00001.safetensors", "r+b") as f:
        f.truncate(80 << 20)
    r = probe(str(d))
    assert r.disk_gb_s is not None and r.disk_gb_s > 0, r
    assert modelcheck._rate(True) is None and modelcheck._rate("3.1") is None and modelcheck._rate(-1) is None
