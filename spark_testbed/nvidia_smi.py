"""nvidia-smi stand-in for the testbed (no GPU here): prints the real formats from a state file.

State file (JSON, written by the tests): {"name": "NVIDIA GB10", "driver": "580.95.05",
"total_mib": null, "processes": [{"pid": 123, "name": "/usr/bin/python3", "used_mib": 19135}],
"meminfo": {"total_mib": 122880, "free_mib": 24576, "cached_mib": 90112, "available_mib": 114688}}.
``total_mib: null`` is GB10's unified memory (totals N/A). Only processes that are alive are listed, as the
driver does; a process with a ``start`` (its /proc/<pid>/stat start time, which testbed.write_gpu records)
is listed only while that PID is still that process, never a later one the kernel gave the same number.

Each node's memory is its own: ``meminfo`` is the node's /proc/meminfo in MiB (the older {"total_mib",
"available_mib"} still reads: then MemFree = MemAvailable and Cached = 0); a state without it, or no state
file, is a node with DEFAULT_MEMINFO. The host's real /proc/meminfo is read only when the state says
``"meminfo": "host"``, and then never dropped.

``"nvml_lost": true`` (testbed.gpu_access_lost) is a container that lost its GPU devices (the host ran
`systemctl daemon-reload` without NVIDIA's CDI refresh): every query prints NVML_LOST on stdout and exits 255,
as the real nvidia-smi does (docs/wire-formats.md §8.3); ``--meminfo`` and ``--drop-caches`` read and change the
node's /proc, not NVML, and still work.

``"container_nvml_lost": true`` (testbed.gpu_access_lost(node, where="container")) is what a real host shows
after that reload: the host's nvidia-smi still works and only ``-L`` asked inside the node's containers (where the
daemon asks it, ray.nvidia_smi) prints NVML_LOST and exits 255. ``-L`` lists the GPU as ``GPU 0: <name> (UUID:
GPU-...)``; ``--state`` defaults to $STANDIN_GPU_STATE (the containers' environment names their node's state).

``--meminfo`` prints the node's /proc/meminfo. ``--drop-caches`` does to the state what
``sync; echo 3 > /proc/sys/vm/drop_caches`` does to a node: the page cache shrinks to a small residue,
MemFree grows by what left it, MemAvailable stays; the figures it leaves are what the next read reports.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import stat
import sys
import tempfile
import time
from typing import Any

XML_HEAD = """<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log>
\t<timestamp>{ts}</timestamp>
\t<driver_version>{driver}</driver_version>
\t<cuda_version>13.0</cuda_version>
\t<attached_gpus>1</attached_gpus>
\t<gpu id="0000000F:01:00.0">
\t\t<product_name>{name}</product_name>
\t\t<product_brand>NVIDIA RTX</product_brand>
\t\t<product_architecture>Blackwell</product_architecture>
\t\t<persistence_mode>Enabled</persistence_mode>
\t\t<fb_memory_usage>
\t\t\t<total>{total}</total>
\t\t\t<reserved>{reserved}</reserved>
\t\t\t<used>{used}</used>
\t\t\t<free>{free}</free>
\t\t</fb_memory_usage>
\t\t<processes>
"""
XML_PROC = """\t\t\t<process_info>
\t\t\t\t<gpu_instance_id>N/A</gpu_instance_id>
\t\t\t\t<compute_instance_id>N/A</compute_instance_id>
\t\t\t\t<pid>{pid}</pid>
\t\t\t\t<type>{type}</type>
\t\t\t\t<process_name>{name}</process_name>
\t\t\t\t<used_memory>{mib} MiB</used_memory>
\t\t\t</process_info>
"""
XML_TAIL = """\t\t</processes>
\t</gpu>
</nvidia_smi_log>
"""


NVML_LOST = "Failed to initialize NVML: Unknown Error"  # nvidia-smi's words, exit NVML_LOST_EXIT
NVML_LOST_EXIT = 255
UUID = "5a7f3c2e-9b41-4d6e-8c0f-1e2d3c4b5a69"  # `-L`'s made-up GPU UUID


class BadState(ValueError):
    pass


def read_state(path: str) -> dict[str, Any]:
    """The state file as written (nothing filtered or added); a missing file is an empty state."""
    try:
        with open(path) as f:
            state = json.loads(f.read(STATE_LIMIT))
    except FileNotFoundError:
        return {}
    if not isinstance(state, dict):
        raise BadState(f"{path}: not a JSON object")
    return state


def proc_start(pid: object) -> int | None:
    """When the process started (clock ticks after boot, field 22 of /proc/<pid>/stat): with its PID it
    names one process. None when there is no such process."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_line = f.read(4096)
        return int(stat_line.rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _alive(p: dict[str, Any]) -> bool:
    start = proc_start(p.get("pid"))
    return start is not None and p.get("start", start) == start


def load_state(path: str) -> dict[str, Any]:
    state = read_state(path)
    state.setdefault("name", "NVIDIA GB10")
    state.setdefault("driver", "580.95.05")
    state.setdefault("total_mib", None)
    state["processes"] = [p for p in state.get("processes", []) if isinstance(p, dict) and _alive(p)]
    return state


def xml(state: dict[str, Any]) -> str:
    total = state["total_mib"]
    used = sum(p["used_mib"] for p in state["processes"])
    def mib(v: int) -> str:
        return f"{v} MiB" if total is not None else "N/A"
    out = XML_HEAD.format(ts=time.strftime("%a %b %d %H:%M:%S %Y"), driver=state["driver"], name=state["name"],
                          total=mib(total), reserved=mib(0), used=mib(used),
                          free=mib((total or 0) - used))
    for p in state["processes"]:
        name = p.get("name", "").replace("&", "&amp;").replace("<", "&lt;")
        out += XML_PROC.format(pid=p["pid"], type=p.get("type", "C"), name=name, mib=p["used_mib"])
    return out + XML_TAIL


def compute_apps_csv(state: dict[str, Any], units: bool) -> str:
    return "".join(f"{p['pid']}, {p.get('name', '')}, {p['used_mib']}{'' if units else ' MiB'}\n"
                   for p in state["processes"])


CACHE_RESIDUE_MIB = 200  # what drop_caches leaves in the page cache (dirty, mapped, in-use pages)
STATE_LIMIT = 1 << 20
HOST_MEMINFO = "/proc/meminfo"  # read only for a state that says "meminfo": "host"
# A node whose state gives no figures: a GB10 (120 GiB) with 8 GiB in use and a little page cache.
DEFAULT_MEMINFO = {"total_mib": 122880, "free_mib": 110592, "cached_mib": 4096, "available_mib": 114688}


def mem_figures(m: dict[str, Any]) -> dict[str, int]:
    """The state's meminfo with every figure present (the older {total_mib, available_mib} form too)."""
    total, available = int(m["total_mib"]), int(m["available_mib"])
    free = int(m.get("free_mib", available))
    return {"total_mib": total, "free_mib": free, "cached_mib": int(m.get("cached_mib", 0)),
            "available_mib": available}


def _host_text() -> str:
    with open(HOST_MEMINFO) as f:
        return f.read(STATE_LIMIT)


def _host_figures() -> dict[str, int]:
    kb = {k: int(v) for k, v in re.findall(r"^(\w+):\s+(\d+) kB$", _host_text(), re.M)}
    return {"total_mib": kb["MemTotal"] // 1024, "free_mib": kb["MemFree"] // 1024,
            "cached_mib": kb.get("Cached", 0) // 1024, "available_mib": kb["MemAvailable"] // 1024}


def node_memory(path: str, state: dict[str, Any]) -> dict[str, int]:
    """The node's memory in MiB: its state's figures, the defaults without them, the host's by opt-in."""
    m = state.get("meminfo")
    if m == "host":
        return _host_figures()
    if not m:
        return dict(DEFAULT_MEMINFO)
    try:
        if not isinstance(m, dict):
            raise TypeError(type(m).__name__)
        return mem_figures(m)
    except (KeyError, TypeError, ValueError) as e:
        raise BadState(f'{path}: meminfo must be {{"total_mib", "available_mib"[, "free_mib", "cached_mib"]}} in '
                       f'MiB or "host", not {json.dumps(m)[:200]} ({type(e).__name__}: {e})') from None


def _kb_line(name: str, mib: int) -> str:
    return f"{name + ':':<16}{mib * 1024:>8} kB\n"  # the kernel's "%-16s%8lu kB"


def meminfo(path: str, state: dict[str, Any]) -> str:
    if state.get("meminfo") == "host":
        return _host_text()
    fig = node_memory(path, state)
    return (_kb_line("MemTotal", fig["total_mib"]) + _kb_line("MemFree", fig["free_mib"])
            + _kb_line("MemAvailable", fig["available_mib"]) + _kb_line("Buffers", 0)
            + _kb_line("Cached", fig["cached_mib"]))


def _write_atomic(path: str, state: dict[str, Any]) -> None:
    """tmp file in the same directory + rename: a reader sees the old file or the new one, never half."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".gpu-", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(state, f)
        try:
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
        except FileNotFoundError:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def drop_caches(path: str) -> str:
    """`sync; echo 3 > /proc/sys/vm/drop_caches` on the stand-in's memory. Returns the line to print."""
    raw = read_state(path)  # as written: processes not filtered, nothing added
    if raw.get("meminfo") == "host":
        return f"drop_caches: {path} reads the host's memory, whose page cache the testbed never drops: nothing dropped"
    m = node_memory(path, raw)
    freed = max(0, m["cached_mib"] - CACHE_RESIDUE_MIB)
    if freed:
        before = dict(m)
        m["cached_mib"] -= freed
        m["free_mib"] += freed
        raw["meminfo"] = m
        _write_atomic(path, raw)
        return (f"drop_caches: freed {freed} MiB of page cache (Cached {before['cached_mib']} -> {m['cached_mib']} "
                f"MiB, MemFree {before['free_mib']} -> {m['free_mib']} MiB, MemAvailable {m['available_mib']} MiB)")
    return f"drop_caches: freed 0 MiB of page cache (Cached {m['cached_mib']} MiB, MemFree {m['free_mib']} MiB)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="nvidia-smi")
    # Inside a deployment's container the daemon runs `nvidia-smi -L` (ray.nvidia_smi): the node's state comes
    # from the container's environment there (etc/testbed.toml's node env).
    p.add_argument("--state", default=os.environ.get("STANDIN_GPU_STATE", ""))
    p.add_argument("-L", dest="list_gpus", action="store_true")
    p.add_argument("-q", action="store_true")
    p.add_argument("-x", action="store_true")
    p.add_argument("--query-compute-apps", default="")
    p.add_argument("--format", default="")
    p.add_argument("--meminfo", action="store_true")
    p.add_argument("--drop-caches", action="store_true")
    a = p.parse_args(argv)
    if not a.state:
        p.error("--state (or STANDIN_GPU_STATE) is required")
    try:
        if a.drop_caches:
            print(drop_caches(a.state))
            return 0
        state = load_state(a.state)
        text = meminfo(a.state, state) if a.meminfo else ""
    except (BadState, ValueError) as e:  # a JSONDecodeError is a ValueError too
        print(f"nvidia-smi stand-in: {e if isinstance(e, BadState) else f'{a.state}: {e}'}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"nvidia-smi stand-in: {a.state}: {e}", file=sys.stderr)
        return 1
    if a.meminfo:
        sys.stdout.write(text)
    elif state.get("nvml_lost") is True or (a.list_gpus and state.get("container_nvml_lost") is True):
        print(NVML_LOST)
        return NVML_LOST_EXIT
    elif a.list_gpus:
        print(f"GPU 0: {state['name']} (UUID: GPU-{UUID})")
    elif a.q and a.x:
        sys.stdout.write(xml(state))
    elif a.query_compute_apps:
        sys.stdout.write(compute_apps_csv(state, "nounits" in a.format))
    else:
        print("stand-in supports -q -x, --query-compute-apps, --meminfo and --drop-caches", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
