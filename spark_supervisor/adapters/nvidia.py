"""Parse `nvidia-smi -q -x` and /proc/meminfo. Pure functions; the commands run through NodeShell."""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET

from ..model import Gpu, GpuProcess, Memory
from . import AdapterError
from .shell import printable


def _mib(text: str | None) -> int | None:
    m = re.match(r"\s*(\d+)\s*MiB", text or "")
    return int(m.group(1)) if m else None  # "N/A" on GB10's unified memory


_PROCESS_NAME = re.compile(r"(<process_name>)(.*?)(</process_name>)", re.DOTALL)


def _escaped_name(m: re.Match[str]) -> str:
    return m.group(1) + html.escape(printable(m.group(2))) + m.group(3)


def parse_smi_xml(text: str) -> Gpu:
    """The first GPU of `nvidia-smi -q -x` (a Spark has one) with its compute processes."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        try:  # nvidia-smi writes a process's name as the process set it: markup or control bytes in it
            root = ET.fromstring(_PROCESS_NAME.sub(_escaped_name, text))
        except ET.ParseError:
            raise AdapterError("NvidiaSmiUnreadable", f"not XML: {e}") from None
    gpu = root.find("gpu")
    if gpu is None:
        raise AdapterError("NoGpu", "nvidia-smi lists no GPU")
    procs = []
    for p in gpu.iterfind("processes/process_info"):
        pid = (p.findtext("pid") or "").strip()
        if pid.isdigit():
            procs.append(GpuProcess(int(pid), printable((p.findtext("process_name") or "").strip()),
                                    _mib(p.findtext("used_memory")) or 0))
    return Gpu(name=(gpu.findtext("product_name") or "").strip(),
               driver=(root.findtext("driver_version") or "").strip(),
               total_mib=_mib(gpu.findtext("fb_memory_usage/total")),
               used_mib=_mib(gpu.findtext("fb_memory_usage/used")),
               processes=tuple(procs), cuda=(root.findtext("cuda_version") or "").strip())


def parse_meminfo(text: str) -> Memory:
    vals = {}
    for line in text.splitlines():
        m = re.match(r"(\w+):\s+(\d+)\s*kB", line)
        if m:
            vals[m.group(1)] = int(m.group(2))
    if "MemTotal" not in vals or "MemAvailable" not in vals:
        raise AdapterError("MeminfoUnreadable", "MemTotal or MemAvailable missing")
    return Memory(vals["MemTotal"] // 1024, vals["MemAvailable"] // 1024,
                  vals["MemFree"] // 1024 if "MemFree" in vals else None,
                  vals["Cached"] // 1024 if "Cached" in vals else None)
