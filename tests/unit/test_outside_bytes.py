"""Bytes from the outside world never crash anything (issue 42, item 1): a process name anyone sets, a program
that cannot be started, a probe whose reader raises what nobody foresaw. Each is that probe's unknown, with
its reason; an unforeseen exception is counted (adapters.UNEXPECTED) and logged, never the tick's crash."""

from __future__ import annotations

import collections
import concurrent.futures as cf
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import prometheus_client
import pytest

from spark_supervisor.adapters import AdapterError, UnexpectedError, guarded, probe
from spark_supervisor.adapters.listening import parse_listening
from spark_supervisor.adapters.nvidia import parse_smi_xml
from spark_supervisor.adapters.shell import printable, run_local
from spark_supervisor.model import Container, EngineStats
from spark_supervisor.report.metrics import Metrics
from spark_supervisor.world import observe
from spark_supervisor.world.observe import observe_node
from tests.fakes import FakeEngine
from tests.helpers import view_of
from tests.unit.test_observe import adapters, world

# A process renames itself (prctl PR_SET_NAME: any user may) to bytes that are not UTF-8, with a newline in them,
# and listens on a port of its own. The name's 15 bytes are all the kernel keeps.
HOSTILE = b"\xff\xfe\x80bad\nname\x1b[31m"
LISTENER = f"""
import ctypes, socket, sys
ctypes.CDLL(None).prctl(15, {HOSTILE!r}, 0, 0, 0)
s = socket.socket()
s.bind(("127.0.0.1", 0))
s.listen()
print(s.getsockname()[1], flush=True)
sys.stdin.read()
"""


@pytest.fixture
def hostile_listener() -> Iterator[int]:
    with subprocess.Popen([sys.executable, "-c", LISTENER], stdin=subprocess.PIPE, stdout=subprocess.PIPE) as p:
        try:
            assert p.stdout is not None
            yield int(p.stdout.readline())
        finally:
            p.kill()


@pytest.fixture
def probes() -> Iterator[cf.Executor]:
    with cf.ThreadPoolExecutor(max_workers=8) as pool:
        yield pool


@pytest.mark.skipif(os.geteuid() != 0, reason="ss names other users' processes to root only")
@pytest.mark.parametrize("remote", [True, False], ids=["worker: one batch", "head: one process each"])
def test_a_listener_named_in_bytes_that_are_not_utf8_is_read_with_its_name_escaped(
        tmp_path: Path, probes: cf.Executor, hostile_listener: int, remote: bool) -> None:
    c, node = world(tmp_path, remote=remote)
    o = observe_node(adapters(node, FakeEngine([])), view_of(c), True, probes)
    assert o.error == "" and o.probe_errors == (), o.probe_errors
    assert o.listening is not None and o.gpu is not None and o.memory is not None
    mine = [x for x in o.listening if x.port == hostile_listener]
    assert len(mine) == 1, o.listening
    assert mine[0].process.startswith("\\xff\\xfe\\x80bad\\nname"), mine[0].process
    assert mine[0].process.isprintable()


def test_ss_lines_continued_by_a_newline_in_a_name_are_one_listener() -> None:
    out = ('LISTEN 0 128 0.0.0.0:22 0.0.0.0:* users:(("sshd",pid=7,fd=3))\n'
           'LISTEN 0 4096 127.0.0.1:8000 0.0.0.0:* users:(("a\n'
           'b\\xff",pid=9,fd=3))\n')
    got = parse_listening(out)
    assert [(x.port, x.process, x.pid) for x in got] == [(22, "sshd", 7), (8000, "a\\nb\\xff", 9)]


def test_a_programs_bytes_that_are_not_utf8_come_back_escaped_not_raised() -> None:
    r = run_local([sys.executable, "-c", "import sys; sys.stdout.buffer.write(b'ok \\xff\\xfe'); "
                   "sys.stderr.buffer.write(b'\\x80')"], 10)
    assert (r.rc, r.out, r.err) == (0, "ok \\xff\\xfe", "\\x80")


def test_a_process_name_with_markup_or_control_bytes_in_nvidia_smi_is_read() -> None:
    xml = ("<nvidia_smi_log><driver_version>580.95.05</driver_version><gpu><product_name>NVIDIA GB10"
           "</product_name><processes><process_info><pid>42</pid><process_name>a<b & \x01c</process_name>"
           "<used_memory>10 MiB</used_memory></process_info></processes></gpu></nvidia_smi_log>")
    gpu = parse_smi_xml(xml)
    assert [(p.pid, p.name, p.used_mib) for p in gpu.processes] == [(42, "a<b & \\x01c", 10)]
    with pytest.raises(AdapterError, match="NvidiaSmiUnreadable"):
        parse_smi_xml("<nvidia_smi_log><gpu>")  # not XML whatever the names: unknown, as before


def test_printable_escapes_what_a_terminal_or_a_log_line_would_act_on() -> None:
    assert printable("vllm serve") == "vllm serve"
    assert printable("a\nb\x1b[31mc\x00") == "a\\nb\\x1b[31mc\\x00"


@pytest.mark.parametrize(("mode", "content", "why"), [
    (0o644, b"#!/bin/sh\n", "Permission denied"),  # no x bit: EACCES, even for root
    (0o755, b"\x7fELF\x01garbage", "Exec format error"),  # ENOEXEC
])
def test_a_program_that_cannot_be_started_is_an_adapter_error_with_its_reason(
        tmp_path: Path, mode: int, content: bytes, why: str) -> None:
    prog = tmp_path / "prog"
    prog.write_bytes(content)
    prog.chmod(mode)
    with pytest.raises(AdapterError, match=f"CommandNotStarted: .*prog: {why}"):
        run_local([str(prog)], 10)


@pytest.mark.parametrize("remote", [True, False], ids=["worker: one batch", "head: one process each"])
def test_a_reader_raising_the_unforeseen_is_that_probes_unknown_counted_and_the_rest_is_read(
        tmp_path: Path, probes: cf.Executor, monkeypatch: pytest.MonkeyPatch, remote: bool,
        unexpected: collections.Counter[str]) -> None:
    def deep(_: object) -> None:
        raise RecursionError("maximum recursion depth exceeded")
    monkeypatch.setattr(observe, "_meminfo", deep)
    c, node = world(tmp_path, remote=remote)
    o = observe_node(adapters(node, FakeEngine([])), view_of(c), True, probes)
    assert o.error == "" and o.memory is None and o.gpu is not None and o.interfaces is not None
    assert o.probe_errors == ("meminfo: ProbeFailed: meminfo: RecursionError: maximum recursion depth exceeded",)
    assert unexpected == {"meminfo": 1}


def test_an_engine_listing_raising_the_unforeseen_is_the_nodes_unknown_not_the_ticks_crash(
        tmp_path: Path, unexpected: collections.Counter[str]) -> None:
    class Broken(FakeEngine):
        def containers(self, trusted: bool = False) -> list[Container]:
            raise KeyError("Names" if not trusted else "Id")
    c, node = world(tmp_path, remote=False)
    o = observe_node(adapters(node, Broken([])), view_of(c), False)
    assert o.error == "ProbeFailed: containers: KeyError: 'Names'" and o.containers == ()
    assert unexpected == {"containers": 1}


def test_an_observation_returning_probe_answers_its_unknown_and_the_metric_counts_it(
        unexpected: collections.Counter[str]) -> None:
    @probe("engine metrics", lambda e: EngineStats(error=str(e)))
    def read(body: str) -> EngineStats:
        return EngineStats(float(body.split()[99]))
    assert read("1 " * 100) == EngineStats(1.0)
    assert read("short").error == "ProbeFailed: engine metrics: IndexError: list index out of range"
    m = Metrics("127.0.0.1", 0)
    try:
        page = prometheus_client.generate_latest(m.registry).decode()
    finally:
        m.close()
    assert 'spark_supervisor_probe_unexpected_errors_total{probe="engine metrics"} 1.0' in page
    assert unexpected == {"engine metrics": 1}


def test_an_adapter_error_passes_through_the_guard_uncounted(unexpected: collections.Counter[str]) -> None:
    def unreadable() -> None:
        raise AdapterError("MeminfoUnreadable", "MemTotal missing")
    with pytest.raises(AdapterError) as e:
        guarded("meminfo", unreadable)
    assert not isinstance(e.value, UnexpectedError) and not unexpected
