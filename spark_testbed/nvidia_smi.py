"""nvidia-smi stand-in for the testbed (no GPU here): prints the real formats from a state file.

State file (JSON, written by the tests): {"name": "NVIDIA GB10", "driver": "580.95.05",
"total_mib": null, "processes": [{"pid": 123, "name": "/usr/bin/python3", "used_mib": 19135}],
"meminfo": {"total_mib": 122880, "available_mib": 110000}}. ``total_mib: null`` is GB10's unified memory
(totals N/A). Only processes that are alive are listed, as the driver does. ``--meminfo`` prints
/proc/meminfo (the state's figures when given, the real file otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
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


def load_state(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            state: dict[str, Any] = json.load(f)
    except FileNotFoundError:
        state = {}
    state.setdefault("name", "NVIDIA GB10")
    state.setdefault("driver", "580.95.05")
    state.setdefault("total_mib", None)
    state["processes"] = [p for p in state.get("processes", []) if os.path.exists(f"/proc/{p['pid']}")]
    return state


def xml(state: dict[str, Any]) -> str:
    total = state["total_mib"]
    used = sum(p["used_mib"] for p in state["processes"])
    mib = (lambda v: f"{v} MiB") if total is not None else (lambda v: "N/A")
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


def meminfo(state: dict[str, Any]) -> str:
    m = state.get("meminfo")
    if not m:
        with open("/proc/meminfo") as f:
            return f.read()
    return (f"MemTotal:       {m['total_mib'] * 1024} kB\nMemFree:        {m['available_mib'] * 1024} kB\n"
            f"MemAvailable:   {m['available_mib'] * 1024} kB\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="nvidia-smi")
    p.add_argument("--state", required=True)
    p.add_argument("-q", action="store_true")
    p.add_argument("-x", action="store_true")
    p.add_argument("--query-compute-apps", default="")
    p.add_argument("--format", default="")
    p.add_argument("--meminfo", action="store_true")
    a = p.parse_args(argv)
    state = load_state(a.state)
    if a.meminfo:
        sys.stdout.write(meminfo(state))
    elif a.q and a.x:
        sys.stdout.write(xml(state))
    elif a.query_compute_apps:
        sys.stdout.write(compute_apps_csv(state, "nounits" in a.format))
    else:
        print("stand-in supports -q -x, --query-compute-apps and --meminfo", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
