"""`report --capture`'s redaction (report/record/pseudonyms.py) and bundle (report/record/capture.py): every
identifying value replaced, the format kept -- each public-format sample parses to the same shape after as
before, and the pseudonyms agree across files -- and the manifest says what each file is and whether it parsed."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest

from spark_supervisor.adapters.nvidia import parse_smi_xml
from spark_supervisor.adapters.sysfs import parse_host_facts
from spark_supervisor.judge import logscan
from spark_supervisor.judge.preflight import parse_ip_addr
from spark_supervisor.report.record import capture as bundle
from spark_supervisor.report.record.pseudonyms import Pseudonyms
from spark_supervisor.world import capture
from tests.helpers import cfg, data
from tests.unit.test_fabric import SYSFS
from tests.unit.test_standin_fabric import REAL_IB, REAL_SOCKET

KEY = b"k" * 32
SMI = """<?xml version="1.0" ?>
<nvidia_smi_log><driver_version>580.95.05</driver_version><cuda_version>13.0</cuda_version>
<gpu id="0000000F:01:00.0"><product_name>NVIDIA GB10</product_name><serial>1652124006942</serial>
<uuid>GPU-4b1d5c3e-9f0a-4c2b-8e7d-6a5f4e3d2c1b</uuid><vbios_version>98.02.2E.00.01</vbios_version>
<fb_memory_usage><total>N/A</total><used>N/A</used></fb_memory_usage><processes><process_info><pid>4242</pid>
<process_name>/home/alice/.venv/bin/python3</process_name><used_memory>90000 MiB</used_memory></process_info>
</processes></gpu></nvidia_smi_log>
"""
IP = """1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
3: enp1s0f1np1    inet 192.168.200.13/24 brd 192.168.200.255 scope global enp1s0f1np1\\       valid_lft forever
3: enp1s0f1np1    inet6 fe80::5e00:ff:fe00:1/64 scope link \\       valid_lft forever preferred_lft forever
4: wlP9s9    inet 10.1.7.42/16 brd 10.1.255.255 scope global dynamic wlP9s9\\       valid_lft 80000sec
"""
IDENTIFYING = ["192.168.200.12", "192.168.200.13", "10.1.7.42", "spark-1", "spark-2", "alice", "1652124006942",
               "4b1d5c3e-9f0a", "0e6c5a34-6d7e", "3d1219c7c4c5404aaa1f6d2a48adfda4", "c0a8:c80d", "5e00:00ff:fe00:0001",
               "5e00:ff:fe00:1"]


def p() -> Pseudonyms:
    return Pseudonyms(KEY, ["spark-1", "spark-2"], ["alice"])


def test_nothing_identifying_is_left_and_the_same_value_gets_the_same_pseudonym() -> None:
    ps = p()
    out = ps.text("\n".join([SYSFS, SMI, IP, *REAL_IB, *REAL_SOCKET]))
    assert [s for s in IDENTIFYING if s in out] == []
    assert ps.text("spark-1 192.168.200.12") == ps.text("spark-1 192.168.200.12") != "spark-1 192.168.200.12"
    other = Pseudonyms(b"x" * 32, ["spark-1"])  # a key per bundle: nothing links two bundles' pseudonyms
    assert other.ipv4("192.168.200.12") != ps.ipv4("192.168.200.12")
    # kept: what identifies no one and what the parsers lean on
    assert ps.text("127.0.0.1 0.0.0.0 255.255.255.0 ::1 NCCL version 2.27.7+cuda13.0 10:00:00 root") == \
        "127.0.0.1 0.0.0.0 255.255.255.0 ::1 NCCL version 2.27.7+cuda13.0 10:00:00 root"


def test_addresses_keep_their_subnets_and_host_numbers() -> None:
    ps = p()
    a, b, c = (ipaddress.ip_address(ps.ipv4(x)) for x in ("192.168.200.12", "192.168.200.13", "192.168.201.12"))
    net = ipaddress.ip_network(f"{a}/24", strict=False)
    assert b in net and c not in net and c in ipaddress.ip_network(f"{a}/23", strict=False)
    assert str(a).endswith(".12") and ps.ipv4("192.168.200.255").endswith(".255")


def test_the_host_facts_parse_to_the_same_shape_with_the_fabric_ip_in_the_gid() -> None:
    ps = p()
    before, after = parse_host_facts(SYSFS), parse_host_facts(ps.text(SYSFS))
    assert after.links == before.links and after.boot_id != before.boot_id and len(after.machine_id) == 32
    ((pb,), (pa,)) = before.rdma, after.rdma
    assert [(g.index, g.type, g.netdev) for g in pa.gids] == [(g.index, g.type, g.netdev) for g in pb.gids]
    assert pa.roce_v2_index(ps.ipv4("192.168.200.13")) == pb.roce_v2_index("192.168.200.13") == 4
    assert (pa.device, pa.state, pa.rate_gbps, pa.firmware) == (pb.device, pb.state, pb.rate_gbps, pb.firmware)


def test_nvidia_smi_parses_to_the_same_gpu_and_ip_addr_to_the_same_interfaces() -> None:
    ps = p()
    gb, ga = parse_smi_xml(SMI), parse_smi_xml(ps.text(SMI))
    assert (ga.name, ga.driver, ga.cuda, ga.total_mib) == (gb.name, gb.driver, gb.cuda, gb.total_mib)
    assert [(x.pid, x.used_mib) for x in ga.processes] == [(x.pid, x.used_mib) for x in gb.processes]
    assert ga.processes[0].name == "/home/user-1/.venv/bin/python3"
    assert "<serial>" in ps.text(SMI) and "98.02.2E.00.01" in ps.text(SMI)  # a version is not an address
    ib, ia = parse_ip_addr(IP), parse_ip_addr(ps.text(IP))
    assert ia.keys() == ib.keys() and ia["lo"] == ib["lo"]
    assert ia["enp1s0f1np1"][0] == f"{ps.ipv4('192.168.200.13')}/24"
    assert ia["enp1s0f1np1"][1].startswith("fe80::") and ia["enp1s0f1np1"][1].endswith("/64")
    # the link-local address and the GID made from the same MAC get the same interface ID
    gid = ps.text("gids/0:fe80:0000:0000:0000:5e00:00ff:fe00:0001").partition(":")[2]
    assert ipaddress.ip_address(gid) == ipaddress.ip_interface(ps.text("fe80::5e00:ff:fe00:1/64")).ip


@pytest.mark.parametrize("lines", [REAL_IB, REAL_SOCKET], ids=["IB", "Socket"])
def test_nccls_lines_give_the_same_ranks_networks_and_devices(lines: list[str]) -> None:
    ps = p()
    before, after = logscan.transports("\n".join(lines)), logscan.transports(ps.text("\n".join(lines)))
    assert [(t.rank, t.net, t.interface) for t in after] == [(t.rank, t.net, t.interface) for t in before]
    assert [t.ip for t in after] == [ps.ipv4(t.ip) for t in before] and {t.host for t in after} <= {"host-1", "host-2"}


def captured(node: str, fmt: str, text: str, rc: int = 0, deployment: str = "") -> capture.Captured:
    return capture.Captured(node, fmt, ("cat", f"/home/alice/{node}"), rc, 1_800_000_000.0, text.encode(),
                            deployment=deployment)


def test_the_bundle_names_each_file_by_its_nodes_pseudonym_and_its_manifest_says_what_it_is() -> None:
    c = cfg(data())
    key = c.deployments[0].api_key.get_secret_value() or ""
    found = [captured("spark-2", "host-facts", SYSFS.replace("host-facts\n", "host-facts\nhostname:gx10-a1b2\n")),
             captured("spark-2", "ip-addr", IP), captured("spark-1", "nvidia-smi", SMI),
             captured("spark-1", "nccl", "\n".join(REAL_IB), deployment="qwen"),
             captured("spark-1", "meminfo", "not meminfo", rc=1),
             capture.Captured("spark-1", "vllm-startup", (), None, 0.0, deployment="qwen", error="no launch on spark-1")]
    members, problems = bundle.collect(c, found, KEY)
    files = dict(members)
    doc = json.loads(files["manifest.json"])
    by = {e["format"]: e for e in doc["files"]}
    assert set(files) == {"manifest.json", "host-2/host-facts.txt", "host-2/ip-addr.txt", "host-1/nvidia-smi.xml",
                          "qwen/host-1/nccl.log", "host-1/meminfo.txt"}
    assert by["nccl"] | {"at": "", "bytes": 0} == {
        "file": "qwen/host-1/nccl.log", "node": "host-1", "deployment": "qwen", "format": "nccl",
        "parser": "judge.logscan.transports", "command": ["cat", "/home/user-1/host-1"], "exit_code": 0, "at": "",
        "bytes": 0, "truncated": False, "error": "", "parses": True}
    assert doc["supervisor"] and by["nccl"]["at"] == "2027-01-15T08:00:00Z"
    assert by["meminfo"]["parses"] is False and "MeminfoUnreadable" in by["meminfo"]["parse_error"]
    assert "vllm-startup" in by and "parses" not in by["vllm-startup"]
    assert problems == ["host-1: meminfo: exit 1", "qwen/host-1: vllm-startup: no launch on host-1"]
    everything = b"".join(files.values()).decode()
    assert [s for s in [*IDENTIFYING, "gx10-a1b2"] if s in everything] == []
    if key:
        assert key not in everything


def test_report_capture_writes_a_bundle_and_says_what_it_could_not_read(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from spark_supervisor import cli
    config = tmp_path / "c.toml"
    config.write_text('[[nodes]]\nname = "spark-1"\nrole = "head"\nfabric_ip = "192.168.200.12"\n'
                      'fabric_interface = "enp1s0f1np1"\n[[deployments]]\nname = "q"\n[deployments.serve]\n'
                      'model = "m"\n[deployments.ray]\nimage = "i"\n'
                      f'[supervisor]\nstate_dir = "{tmp_path}/state"\n')
    monkeypatch.setattr(capture, "capture", lambda _cfg: [captured("spark-1", "nvidia-smi", SMI),
                                                          captured("spark-1", "ip-addr", "", rc=127)])
    out = tmp_path / "b.tar.gz"
    assert cli.main(["report", "--capture", "--out", str(out), "-c", str(config)]) == 0
    import tarfile
    with tarfile.open(out) as tar:
        names = sorted(m.name.split("/", 1)[1] for m in tar.getmembers())
    assert names == ["README.txt", "host-1/nvidia-smi.xml", "manifest.json"]
