"""`spark-supervisor logscan` shows the network NCCL chose for each rank (issue 44): what the daemon reads from the
serve log (logscan.transports) -- IB or Socket, the device or interface, the address -- in text and in JSON,
and says so when the log has NCCL lines but no rank finished its "Init COMPLETE". Held to the public NCCL
lines kept in tests/unit/test_standin_fabric.py (docs/wire-formats.md §8.1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_supervisor import cli
from tests.unit.test_standin_fabric import REAL_IB, REAL_SOCKET


def logscan(tmp_path: Path, capsys: pytest.CaptureFixture[str], lines: list[str], *args: str) -> str:
    log = tmp_path / "serve.log"
    log.write_text("\n".join(lines) + "\n")
    cli.main(["logscan", str(log), *args])
    return capsys.readouterr().out


def test_each_rank_on_rdma_with_its_device_and_address(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = logscan(tmp_path, capsys, REAL_IB).splitlines()
    assert [ln for ln in out if ln.startswith("nccl")] == [
        "nccl rank 0: IB (RDMA) via rocep1s0f1 at 192.168.200.12 on spark-1",
        "nccl rank 1: IB (RDMA) via rocep1s0f1 at 192.168.200.13 on spark-2"]


def test_ranks_on_sockets_in_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = json.loads(logscan(tmp_path, capsys, REAL_SOCKET, "--json"))["nccl"]
    assert doc["complete"] is True
    assert [(r["rank"], r["net"], r["interface"], r["ip"], r["host"]) for r in doc["ranks"]] == [
        (0, "Socket", "enp1s0f1np1", "192.168.200.12", "spark-1"),
        (1, "Socket", "enp1s0f1np1", "192.168.200.13", "spark-2")]
    assert doc["ranks"][1]["detail"] == "NET/Socket : Using [0]enp1s0f1np1:192.168.200.13<0>"
    assert doc["ranks"][1]["line"].endswith("NCCL INFO Using network Socket")


def test_nccl_lines_without_init_complete_are_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    started = [ln for ln in REAL_IB if "Init COMPLETE" not in ln]
    out = logscan(tmp_path, capsys, started)
    assert "nccl rank ?: IB (RDMA) via rocep1s0f1 at 192.168.200.12 on spark-1" in out
    assert 'no rank logged "Init COMPLETE"' in out
    assert json.loads(logscan(tmp_path, capsys, started, "--json"))["nccl"]["complete"] is False
    only = logscan(tmp_path, capsys, [REAL_IB[1]])  # "NCCL version ...": NCCL ran, no network said
    assert "no rank says which network it uses" in only and 'no rank logged "Init COMPLETE"' in only


def test_a_log_without_nccl_lines_shows_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = "INFO 12-04 10:00:00 [core.py:90] Model loading took 1 GiB and 2 seconds"
    assert "nccl" not in logscan(tmp_path, capsys, [line])
    assert json.loads(logscan(tmp_path, capsys, [line], "--json"))["nccl"] is None
