"""`copy-model`'s pure parts and its scripts run here: the listing of a hub snapshot (links followed, blob
names read), the plan of what to send, the deadlines, the verdict on what arrived, the model check's
ModelCopyDiffers between members, and the stream, the sha256 and the renames on local directories."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from spark_supervisor.judge import modelcheck, modelcopy
from spark_supervisor.judge.modelcopy import Entry
from spark_supervisor.model import ModelReport
from spark_supervisor.specs import modelcopy as spec
from spark_supervisor.world.modelcopy import CopyProblem, stream
from tests.helpers import cfg

SHA = "ab" * 32


def hub(root: Path, files: dict[str, bytes], *, blobs: bool = True) -> Path:
    """A hub cache's repo: blobs named by their content's sha256, a snapshot of links to them."""
    snap = root / "snapshots" / ("c" * 40)
    snap.mkdir(parents=True)
    (root / "blobs").mkdir()
    for name, data in files.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        if blobs:
            blob.write_bytes(data)
        (snap / name).symlink_to(os.path.relpath(blob, snap))
    return snap


def listed(d: Path) -> dict[str, Entry]:
    r = subprocess.run(spec.list_argv(str(d)), capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode in (0, 3), r.stderr
    return modelcopy.parse_listing(r.stdout) if r.returncode == 0 else {}


FILES = {"config.json": b"{}", "model-1.safetensors": b"a" * 5000, "model-2.safetensors": b"b" * 7000}


# ------------------------------------------------------------------------------------ listing and plan
def test_the_listing_follows_links_and_reads_the_blob_names(tmp_path: Path) -> None:
    snap = hub(tmp_path / "repo", FILES)
    got = listed(snap)
    assert {p: (e.kind, e.size) for p, e in got.items()} == {"config.json": ("f", 2), "model-1.safetensors": ("f", 5000),
                                                             "model-2.safetensors": ("f", 7000)}
    assert got["model-1.safetensors"].sha256 == hashlib.sha256(FILES["model-1.safetensors"]).hexdigest()
    assert listed(tmp_path / "nothing-here") == {}


def test_a_folder_of_links_alone_is_dangling_links_and_all_of_it_is_sent(tmp_path: Path) -> None:
    head = listed(hub(tmp_path / "a", FILES))
    worker = listed(hub(tmp_path / "b", FILES, blobs=False))
    assert {e.kind for e in worker.values()} == {"l"}
    p = modelcopy.plan(head, worker)
    assert p.send == tuple(sorted(FILES)) and set(p.why.values()) == {"a dangling link"}
    assert p.nbytes == 12002 and p.hashed == p.send and not p.problems


def test_only_what_differs_is_sent_and_why() -> None:
    head = {"a": Entry("f", 100, f"../../blobs/{SHA}"), "b": Entry("f", 5 << 30), "c": Entry("f", 10),
            "d": Entry("f", 10, f"../../blobs/{SHA}")}
    worker = {"b": Entry("f", 4 << 30), "c": Entry("f", 10), "d": Entry("f", 10, f"../../blobs/{'cd' * 32}"),
              "only-here": Entry("f", 1)}
    p = modelcopy.plan(head, worker)
    assert p.why == {"a": "absent", "b": "4.0 GiB, head 5.0 GiB", "d": "another blob, same size"}
    assert p.same == ("c",) and p.extra == ("only-here",) and p.hashed == ("a", "d")
    assert modelcopy.plan(head, worker, resend=True).send == ("a", "b", "c", "d")
    assert modelcopy.plan({"x": Entry("f", 10)}, {"x": Entry("f", 9)}).why == {"x": "9 B, head 10 B"}


def test_a_head_without_a_whole_copy_sends_nothing() -> None:
    p = modelcopy.plan({"a": Entry("l", 0, "../../blobs/x"), "b": Entry("f", 3)}, {})
    assert p.send == () and p.problems == ("a (a dangling link on the head)",)
    assert modelcopy.plan({}, {}).problems == ("no files on the head",)


def test_the_deadline_scales_with_the_bytes() -> None:
    assert modelcopy.deadline_s(0) == modelcopy.FIXED_S
    assert modelcopy.deadline_s(120 << 30, 50e6) == pytest.approx(120 + (120 << 30) / 50e6)
    assert modelcopy.hash_deadline_s(2 * int(modelcopy.HASH_RATE)) == modelcopy.FIXED_S + 2


def test_what_arrived_is_judged_by_size_and_sha256() -> None:
    head = {"a": Entry("f", 10, f"../../blobs/{SHA}"), "b": Entry("f", 20)}
    p = modelcopy.plan(head, {})
    assert modelcopy.verify(p, head, {"a": Entry("f", 10), "b": Entry("f", 20)}, {"a": SHA}) == []
    assert modelcopy.verify(p, head, {"a": Entry("f", 10), "b": Entry("f", 20)}, None) == []  # --no-sha256
    bad = modelcopy.verify(p, head, {"a": Entry("f", 10), "b": Entry("f", 19)}, {"a": "00" * 32})
    assert bad == [f"a sha256 {'0' * 16}…, the hub's {SHA[:16]}…", "b 19 B, head 20 B"]
    assert modelcopy.verify(p, head, {}, {}) == ["a did not arrive", "b did not arrive"]
    assert modelcopy.parse_hashes(f"{SHA}  a\nnoise\n") == {"a": SHA}


# ------------------------------------------------------------------- the model check between members
def report(node: str, **kw: object) -> ModelReport:
    base: dict[str, object] = dict(path=f"/hub/models--Org--M/snapshots/{'c' * 40}", source="hub", revision="c" * 40,
                                   files=2, sizes=(("m-1.safetensors", 5 << 30), ("m-2.safetensors", 5 << 30)))
    return ModelReport(node, "Org/M", "k", **{**base, **kw})  # type: ignore[arg-type]


def test_a_truncated_shard_on_a_member_is_model_copy_differs_with_the_copy_to_run() -> None:
    c = cfg()
    short = report("spark-2", sizes=(("m-1.safetensors", 5 << 30), ("m-2.safetensors", int(4.1 * (1 << 30)))))
    found = modelcheck.problem(c, c.deployment, {"spark-1": report("spark-1"), "spark-2": short})
    assert found is not None
    kind, detail = found
    assert kind == "ModelCopyDiffers" and detail.startswith("spark-2: m-2.safetensors 4.1 GiB, head 5.0 GiB ("), detail
    assert f"`spark-supervisor copy-model {c.deployment.name} --to spark-2`" in detail
    assert modelcheck.problem(c, c.deployment, {"spark-1": report("spark-1"), "spark-2": report("spark-2")}) is None


@pytest.mark.parametrize("other, want", [
    (dict(sizes=(("m-1.safetensors", 5 << 30), ("m-2.safetensors", (5 << 30) - 96))),
     f"m-2.safetensors {(5 << 30) - 96:,} B, head {5 << 30:,} B"),
    (dict(sizes=(("m-1.safetensors", 5 << 30),)), "m-2.safetensors absent, head 5.0 GiB"),
    (dict(blobs=(("m-1.safetensors", "ee" * 32),)), "m-1.safetensors blob eeeeeeeeeeee…, head abababababab… "
                                                    "(another content, same size)"),
])
def test_what_differs_between_members(other: dict[str, object], want: str) -> None:
    head = report("spark-1", blobs=(("m-1.safetensors", SHA),))
    assert modelcheck.differences(head, report("spark-2", **other)) == [want]


def test_a_missing_or_unchecked_model_or_another_snapshot_name_is_not_a_difference() -> None:
    assert modelcheck.differences(report("spark-1"), report("spark-2", revision="d" * 40)) == []  # a prefetch's own
    assert modelcheck.differences(report("spark-1"), report("spark-2", missing=("x",), sizes=())) == []
    assert modelcheck.differences(report("spark-1"), ModelReport("spark-2", "Org/M", "k", unchecked="no python")) == []
    # a weight file only the member has: not what vLLM loads, and copy-model leaves it there (it could never clear)
    extra = report("spark-2", sizes=(("m-1.safetensors", 5 << 30), ("m-2.safetensors", 5 << 30),
                                     ("training_args.bin", 5)))
    assert modelcheck.differences(report("spark-1"), extra) == []


# ------------------------------------------------------------------------- the commands, run locally
def test_over_the_fabric_keeps_the_target_and_its_host_key() -> None:
    argv = ["ssh", "-o", "BatchMode=yes", "spark-2", "--", "true"]
    assert spec.over_fabric(argv, "10.0.0.2", "[spark-2.lan]:2222") == [
        "ssh", "-o", "BatchMode=yes", "-o", "HostName=10.0.0.2", "-o", "HostKeyAlias=[spark-2.lan]:2222",
        "spark-2", "--", "true"]
    with pytest.raises(ValueError):
        spec.over_fabric(["tar", "-c"], "10.0.0.2", "x")
    assert spec.key_alias("hostname spark-2.lan\nport 22\nhostkeyalias none\n", "s2") == "spark-2.lan"
    assert spec.key_alias("hostname 127.0.0.1\nport 2222\n", "s2") == "[127.0.0.1]:2222"
    assert spec.key_alias("hostname h\nport 22\nhostkeyalias pinned\n", "s2") == "pinned"
    assert spec.partial_dir("/c/snapshots/abc/") == "/c/snapshots/.abc.spark-partial"


def test_the_stream_the_sha256_and_the_renames_leave_a_whole_copy(tmp_path: Path) -> None:
    src = hub(tmp_path / "head", FILES)
    dest = hub(tmp_path / "worker", FILES, blobs=False)  # the links alone
    head, p = listed(src), modelcopy.plan(listed(src), listed(dest))
    partial = spec.partial_dir(str(dest))
    seen: list[int] = []
    moved, _ = stream(spec.source_argv(str(src), list(p.send)), spec.sink_argv(partial), total=p.nbytes,
                      deadline=60, stall_s=30, progress=lambda n, _s: seen.append(n))
    assert moved >= p.nbytes and seen and not any(os.path.islink(dest / f) is False for f in FILES)  # not yet in place
    r = subprocess.run(spec.hash_argv(partial, list(p.hashed)), capture_output=True, text=True, timeout=30, check=True)
    assert modelcopy.verify(p, head, listed(Path(partial)), modelcopy.parse_hashes(r.stdout)) == []
    ref = tmp_path / "worker" / "refs" / "main"
    subprocess.run(spec.finish_argv(partial, str(dest), str(ref), "c" * 40, list(p.send)), check=True, timeout=30)
    assert {f: (dest / f).read_bytes() for f in FILES} == FILES and not any((dest / f).is_symlink() for f in FILES)
    assert ref.read_text() == "c" * 40 and not Path(partial).exists()
    assert modelcopy.plan(listed(src), listed(dest)).send == ()


def test_a_stream_that_stalls_is_stopped_and_says_so(tmp_path: Path) -> None:
    with pytest.raises(CopyProblem, match=r"after 0 of 10 bytes \(no byte moved for 0.5s\)"):
        stream(["sleep", "30"], ["sh", "-c", "cat > /dev/null"], total=10, deadline=60, stall_s=0.5,
               progress=lambda _n, _s: None)
    with pytest.raises(CopyProblem, match="head's tar exit 2"):
        stream(["tar", "-C", str(tmp_path), "-cf", "-", "--", "absent"], ["sh", "-c", "cat > /dev/null"], total=10,
               deadline=60, stall_s=30, progress=lambda _n, _s: None)
