"""The contract a captured format is held to (issue 44, item 7): every file of every bundle under
tests/fixtures/formats/ (one folder per `spark-supervisor report --capture`, extracted as it came) parses through
the parser its manifest names, the one the daemon reads it with, and says what the daemon needs of it. A real
Spark's bundle dropped in as tests/fixtures/formats/<name>/ is held to the same, with no code to write:
testbed/ is the testbed's own (stand-in formats, captured by tests/integration/test_capture.py's path)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from spark_supervisor.model import Gpu, HostFacts, Memory, RayObservation, Transport
from spark_supervisor.world import capture

FORMATS = Path(__file__).parents[1] / "fixtures" / "formats"
BUNDLES = sorted(p.parent for p in FORMATS.glob("*/manifest.json"))
ENTRIES = [(b, e) for b in BUNDLES for e in json.loads((b / "manifest.json").read_text())["files"]
           if (b / e["file"]).is_file()]


def test_there_is_a_bundle_and_every_format_is_in_one() -> None:
    assert BUNDLES, f"no bundle under {FORMATS}"
    assert {e["format"] for _, e in ENTRIES} == set(capture.FORMATS)


@pytest.mark.parametrize(("bundle", "entry"), ENTRIES, ids=[f"{b.name}/{e['file']}" for b, e in ENTRIES])
def test_each_captured_file_parses_through_the_daemons_parser(bundle: Path, entry: dict[str, Any]) -> None:
    raw = (bundle / entry["file"]).read_bytes()
    assert entry["parser"] == capture.FORMATS[entry["format"]].parser and entry["bytes"] == len(raw)
    read = capture.read_back(entry["format"], raw)
    match entry["format"]:
        case "nvidia-smi":
            assert isinstance(read, Gpu) and read.name and read.driver
        case "host-facts":
            assert isinstance(read, HostFacts) and read.boot_id and read.kernel and read.links
        case "meminfo":
            assert isinstance(read, Memory) and read.total_mib > 0 and read.available_mib is not None
        case "ip-addr":
            assert isinstance(read, dict) and all(all("/" in a for a in v) for v in read.values())
        case "vllm-startup":
            assert read.milestone and read.version  # type: ignore[attr-defined]
        case "nccl":
            assert all(isinstance(t, Transport) and t.net in ("IB", "Socket") for t in read)  # type: ignore[attr-defined]
        case "ray-nodes":
            assert isinstance(read, RayObservation) and read.reachable and read.nodes and not read.incomplete


@pytest.mark.parametrize("bundle", BUNDLES, ids=[b.name for b in BUNDLES])
def test_a_bundles_files_agree_on_each_nodes_fabric_address(bundle: Path) -> None:
    """Redaction replaced each address by one pseudonym everywhere: the IPv4 of a node's RoCE v2 GIDs is the
    one NCCL's rank on it names (when the log has NCCL lines) and the one Ray knows it by."""
    entries = [e for b, e in ENTRIES if b == bundle]

    def read(fmt: str) -> list[Any]:
        return [capture.read_back(fmt, (bundle / e["file"]).read_bytes()) for e in entries if e["format"] == fmt]
    gids = {g.ipv4 for h in read("host-facts") for p in h.rdma for g in p.gids if g.ipv4 and g.type == "RoCE v2"}
    ranks = {t.ip for found in read("nccl") for t in found if t.ip}
    ray = {n.ip for r in read("ray-nodes") for n in r.nodes}
    assert ranks <= gids and ray <= gids, (gids, ranks, ray)
