"""The facts a record holds that the daemon reads for it (issue 25): each node's kernel, name and release files
(scripts/host-facts.sh, read here on real trees), the CUDA version nvidia-smi names, what vLLM runs on in the
image (torch, transformers, NCCL) and its ID and digests, the model's revision and the hash of its config."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import structlog

from spark_supervisor.adapters.nvidia import parse_smi_xml
from spark_supervisor.adapters.sysfs import parse_host_facts
from spark_supervisor.judge import modelcheck
from spark_supervisor.judge.preflight import parse_image_probe
from spark_supervisor.model.host import NONE
from spark_supervisor.specs import commands, modelprobe
from spark_supervisor.state import statefile
from spark_supervisor.world.act import Actor
from tests.helpers import cfg, data, view_of


def host_facts(root: Path) -> str:
    """The real script on a tree, as the daemon runs it (its root positional)."""
    return subprocess.run(["sh", "-c", commands.HOST_FACTS, "host-facts", str(root)], capture_output=True,
                          text=True, timeout=30, check=True).stdout


def test_a_dgx_os_host_says_its_kernel_release_and_dgx_version(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    (tmp_path / "usr/lib").mkdir(parents=True)
    (tmp_path / "usr/lib/os-release").write_text('NAME="Ubuntu"\nVERSION_ID="24.04"\nPRETTY_NAME="Ubuntu 24.04.3 LTS"\n')
    (tmp_path / "etc/os-release").symlink_to("../usr/lib/os-release")  # as Ubuntu has it
    (tmp_path / "etc/dgx-release").write_text('DGX_NAME="DGX Spark"\nDGX_PRETTY_NAME="NVIDIA DGX Spark"\n'
                                              'DGX_SWBUILD_DATE="2025-09-10"\nDGX_OS_VERSION="7.2.1"\n'
                                              'DGX_SERIAL_NUMBER="1234567890"\n')
    h = parse_host_facts(host_facts(tmp_path))
    assert (h.kernel, h.hostname) == (os.uname().release, os.uname().nodename)
    assert (h.os, h.os_version, h.dgx) == ("Ubuntu 24.04.3 LTS", "24.04", "NVIDIA DGX Spark 7.2.1")
    assert "1234567890" not in host_facts(tmp_path)  # only the lines it names are read: no serial number


def test_a_host_without_release_files_or_rdma_says_none_not_unknown(tmp_path: Path) -> None:
    h = parse_host_facts(host_facts(tmp_path))
    assert (h.os, h.os_version, h.dgx, h.rdma) == (NONE, NONE, NONE, ())
    assert h.kernel == os.uname().release


def test_a_release_file_there_but_unreadable_is_unknown(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    os.mkfifo(tmp_path / "etc/dgx-release")  # not read (a FIFO would hang grep): there, so not "none" either
    (tmp_path / "etc/os-release").write_text("ID=debian\n")  # read, but without the lines wanted
    h = parse_host_facts(host_facts(tmp_path))
    assert (h.dgx, h.os, h.os_version) == ("", "", "")


def test_an_answer_of_an_earlier_script_reads_as_not_read() -> None:
    h = parse_host_facts("host-facts\nproc/sys/kernel/random/boot_id:b\n")
    assert (h.kernel, h.hostname, h.os, h.dgx, h.boot_id) == ("", "", "", "", "b")


def test_nvidia_smi_names_the_cuda_version() -> None:
    xml = ("<nvidia_smi_log><driver_version>580.95.05</driver_version><cuda_version>13.0</cuda_version>"
           "<gpu><product_name>NVIDIA GB10</product_name></gpu></nvidia_smi_log>")
    g = parse_smi_xml(xml)
    assert (g.name, g.driver, g.cuda) == ("NVIDIA GB10", "580.95.05", "13.0")


def test_the_image_probe_reads_torch_transformers_and_nccl_from_package_metadata(tmp_path: Path) -> None:
    site = tmp_path / "site"
    for dist, version in (("vllm", "0.11.0"), ("torch", "2.9.0"), ("nvidia_nccl_cu12", "2.27.7")):
        info = site / f"{dist}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: {version}\n")
    out = subprocess.run([sys.executable, "-S", "-c", commands.IMAGE_PROBE_PY, "vllm"], capture_output=True, text=True,
                         timeout=60, env={"PYTHONPATH": str(site)}, check=True).stdout
    r = parse_image_probe("spark-1", "img", "k", out)
    assert (r.vllm_version, r.torch_version, r.nccl_version, r.transformers_version) == ("0.11.0", "2.9.0", "2.27.7", "")


class _Engine:
    """An engine holding one image, whose probe prints what a vLLM image prints."""

    def __init__(self, out: str) -> None:
        self.out, self.probes = out, 0

    def has_image(self, _image: str) -> bool:
        return True

    def image_ref(self, _image: str) -> tuple[str, tuple[str, ...]]:
        return "sha256:" + "a" * 64, ("vllm/vllm-openai@sha256:" + "d" * 64,)

    def run_once(self, _spec: object) -> tuple[int, str]:
        self.probes += 1
        return 0, self.out


def test_the_image_check_keeps_the_id_and_digests_and_checks_a_report_of_an_earlier_version_again(tmp_path: Path) -> None:
    d = data()
    d["supervisor"]["state_dir"] = str(tmp_path / "state")
    d["deployments"][0]["model"] = {"check": False}
    c = cfg(d)
    node = c.nodes[0]
    engine = _Engine("vllm_path=/usr/bin/vllm\nvllm_version=0.11.0\ntorch_version=2.9.0\nray_path=/usr/bin/ray\n")
    world = SimpleNamespace(cfg=c, view=view_of(c), nodes={node.name: SimpleNamespace(node=node, docker=engine)})
    actor = Actor(world, structlog.get_logger())  # type: ignore[arg-type]
    r = actor._check_image(world.nodes[node.name])
    assert r.image_id == "sha256:" + "a" * 64 and r.repo_digests == ("vllm/vllm-openai@sha256:" + "d" * 64,)
    assert r.torch_version == "2.9.0" and engine.probes == 1
    assert actor._check_image(world.nodes[node.name]) == r and engine.probes == 1  # kept, by its ID
    kept = statefile.read_json(str(tmp_path / "state"), statefile.NODES)
    del kept[node.name]["report"]["torch_version"]  # what an earlier version kept: it did not read torch
    statefile.write_json(str(tmp_path / "state"), statefile.NODES, kept)
    assert actor._check_image(world.nodes[node.name]) == r and engine.probes == 2  # checked again


def test_the_model_check_reads_the_revision_and_hashes_the_config(tmp_path: Path) -> None:
    snap = tmp_path / "hub/models--Org--M/snapshots/0123abcd"
    snap.mkdir(parents=True)
    (tmp_path / "hub/models--Org--M/refs").mkdir()
    (tmp_path / "hub/models--Org--M/refs/main").write_text("0123abcd")
    (snap / "config.json").write_text('{"architectures": ["X"]}')
    (snap / "model.safetensors").write_bytes(b"w" * 100)
    out = subprocess.run([sys.executable, "-c", modelprobe.PROBE_PY, "Org/M", "", str(tmp_path / "hub")],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    m = modelcheck.judge("spark-1", "Org/M", "k", modelcheck.parse(out))
    assert m.revision == "0123abcd" and m.config_sha256 == hashlib.sha256(b'{"architectures": ["X"]}').hexdigest()
    assert (m.files, m.bytes, m.missing) == (1, 100, ())
    local = modelcheck.judge("spark-1", str(snap), "k", {"source": "local", "dir": str(snap), "kind": "dir", "files": {}})
    assert (local.revision, local.config_sha256) == ("", "")  # a directory has no revision; its config not read
