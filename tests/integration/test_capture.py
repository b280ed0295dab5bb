"""`report --capture` on the testbed (issue 44, item 7): with a deployment serving, the bundle holds every format
our parsers read, from both nodes, each as the parser reads it and each parsing back through that parser; nothing
of the testbed's addresses or names is left in it, and the pseudonyms agree across files (a node's fabric IP in
its RoCE GID is the address NCCL's rank on it bootstrapped on and Ray knows it by), so redaction kept the format.
The testbed's formats are the stand-ins' (nvidia-smi, sysfs under the host trees, NCCL's lines): this proves the
capture path end to end; a real Spark's bundle is what the contract test (tests/unit/test_capture_contract.py)
is for."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from spark_supervisor.adapters.sysfs import parse_host_facts
from spark_supervisor.model import Transport
from spark_supervisor.world import capture
from spark_testbed import testbed
from spark_testbed.harness import BACKEND, BIN

pytestmark = pytest.mark.testbed

HOST_FORMATS = {"nvidia-smi", "host-facts", "ip-addr", "meminfo"}
FABRIC = {"spark-1": "127.0.0.2", "spark-2": "127.0.0.3"}  # etc/testbed.toml's fabric_ip


def identifying() -> set[str]:
    """What must not be in the bundle: the testbed's node names and fabric IPs, this machine's name and every
    address it has but loopback's own."""
    out = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, timeout=10, check=True).stdout
    mine = {a.split("/")[0] for a in re.findall(r"\binet6? (\S+)", out)} - {"127.0.0.1", "::1"}
    return {*testbed.NODES, *FABRIC.values(), socket.gethostname(), *mine}


def extract(path: Path) -> tuple[dict[str, Any], dict[str, bytes]]:
    with tarfile.open(path) as tar:
        files = {m.name.split("/", 1)[1]: tar.extractfile(m).read()  # type: ignore[union-attr]
                 for m in tar.getmembers() if m.isfile()}
    return json.loads(files["manifest.json"]), files


def test_a_capture_holds_every_format_of_both_nodes_redacted_and_each_parses_back(shared: Any,
                                                                                     tmp_path: Path) -> None:
    d = shared()
    out = tmp_path / "capture.tar.gz"
    r = subprocess.run([str(BIN / "spark-supervisor"), "report", "--capture", "--out", str(out), "-c", str(d.config)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "not captured" not in r.stderr, r.stderr
    manifest, files = extract(out)
    entries = manifest["files"]
    assert manifest["supervisor"] and all(e["exit_code"] == 0 and e["parses"] and not e["error"] for e in entries), \
        json.dumps(entries, indent=1)
    nodes = sorted({e["node"] for e in entries})
    assert len(nodes) == 2 and not set(nodes) & set(testbed.NODES)  # pseudonyms, one per node
    for node in nodes:
        assert {e["format"] for e in entries if e["node"] == node and not e["deployment"]} == HOST_FORMATS
    serve_logs = {e["format"] for e in entries if e["deployment"] == "testbed"}
    assert serve_logs >= {"vllm-startup", "nccl"} | ({"ray-nodes"} if BACKEND == "ray" else set())
    parsed = {e["file"]: capture.read_back(e["format"], files[e["file"]]) for e in entries}

    # A name as a whole word (this machine may be called "vm": "nvmlDev" is no leak), an address not inside a longer
    # one (127.0.0.2 is not in 127.0.0.21), wherever it is ("lo:127.0.0.2<0>" in NCCL's lines).
    leaks = {f"{name}: {s}" for name, data in files.items() for s in identifying()
             if re.search((rf"(?<![\d.]){re.escape(s)}(?!\d)" if re.fullmatch(r"[\d.]+|[\da-f:]+", s)
                           else rf"(?<!\w){re.escape(s)}(?!\w)").encode(), data)}
    assert not leaks, sorted(leaks)

    # One address per node, the same in every file: the RoCE v2 GID's IPv4, NCCL's and Ray's.
    fabric = {}
    for e in entries:
        if e["format"] == "host-facts":
            h = parse_host_facts(files[e["file"]].decode())
            fabric[e["node"]] = next(g.ipv4 for p in h.rdma for g in p.gids if g.type == "RoCE v2" and g.ipv4)
    assert len(set(fabric.values())) == 2 and not set(fabric.values()) & set(FABRIC.values())
    ranks = [t for e in entries if e["format"] == "nccl" for t in parsed[e["file"]]]  # type: ignore[attr-defined]
    assert all(isinstance(t, Transport) for t in ranks)
    assert {t.rank for t in ranks} == {0, 1} and {t.ip for t in ranks} == set(fabric.values()), ranks
    if BACKEND == "ray":
        (ray,) = (parsed[e["file"]] for e in entries if e["format"] == "ray-nodes")
        assert {n.ip for n in ray.nodes if n.alive} == set(fabric.values())  # type: ignore[attr-defined]
