import json
from pathlib import Path

import pytest

from spark_supervisor.adapters import AdapterError
from spark_supervisor.adapters.nvidia import parse_meminfo, parse_smi_xml
from spark_testbed import nvidia_smi

DISCRETE = """<?xml version="1.0" ?>
<nvidia_smi_log><driver_version>550.54.15</driver_version><gpu id="00000000:01:00.0">
<product_name>NVIDIA H100 80GB HBM3</product_name>
<fb_memory_usage><total>81559 MiB</total><reserved>328 MiB</reserved><used>70000 MiB</used><free>11231 MiB</free></fb_memory_usage>
<processes><process_info><gpu_instance_id>N/A</gpu_instance_id><compute_instance_id>N/A</compute_instance_id>
<pid>41394</pid><type>C</type><process_name></process_name><used_memory>69000 MiB</used_memory></process_info></processes>
</gpu></nvidia_smi_log>"""


def test_gb10_totals_are_na_but_processes_have_mib(tmp_path: Path) -> None:
    state = tmp_path / "gpu.json"
    state.write_text(json.dumps({"processes": [{"pid": 1, "name": "/usr/lib/xorg/Xorg", "used_mib": 40, "type": "G"},
                                               {"pid": 999999999, "name": "gone", "used_mib": 5}]}))
    gpu = parse_smi_xml(nvidia_smi.xml(nvidia_smi.load_state(str(state))))
    assert (gpu.name, gpu.driver, gpu.total_mib, gpu.used_mib) == ("NVIDIA GB10", "580.95.05", None, None)
    assert [(p.pid, p.name, p.used_mib) for p in gpu.processes] == [(1, "/usr/lib/xorg/Xorg", 40)]


def test_discrete_gpu_with_a_nameless_process() -> None:
    gpu = parse_smi_xml(DISCRETE)
    assert gpu.total_mib == 81559 and gpu.used_mib == 70000
    assert gpu.processes[0].pid == 41394 and gpu.processes[0].name == "" and gpu.processes[0].used_mib == 69000


def test_unreadable_output_is_a_reason() -> None:
    with pytest.raises(AdapterError, match="NvidiaSmiUnreadable"):
        parse_smi_xml("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")


def test_meminfo() -> None:
    m = parse_meminfo("MemTotal:       125829120 kB\nMemFree:         1000 kB\nMemAvailable:   113246208 kB\n")
    assert (m.total_mib, m.available_mib) == (122880, 110592)
    with pytest.raises(AdapterError):
        parse_meminfo("nothing")
