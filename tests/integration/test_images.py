"""Any image, on the testbed: the image check before the first start, and Ray without its dashboard."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

from spark_testbed import testbed
from spark_testbed.harness import BIN, OWNED, Supervisor, containers, verify_serving, write_config


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "spark-supervisor"), *args], capture_output=True, text=True, timeout=timeout)


def test_an_image_without_ray_is_failed_before_any_container_starts(supervisor: Callable[..., Supervisor],
                                                                     tmp_path: Path) -> None:
    # A vLLM image after 0.19.1 as far as the check can tell: no `ray` (and here no vllm either).
    config = write_config(tmp_path, deployment={"ray": {"image": testbed.BUSYBOX, "volumes": [],
                                                        "command": ["ray", "start"]}})
    out = cli("check", "--preflight", "--config", str(config))
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"image {testbed.BUSYBOX} on spark-2: no ray, no vllm" in out.stdout
    assert "preflight: ImageLacksRay: spark-1, spark-2: no `ray` in" in out.stdout
    d = supervisor(config)
    st = d.wait_phase("FAILED", 90)
    assert st["reason"].startswith("ImageLacksRay: spark-1, spark-2: no `ray` in spark-testbed/busybox:latest")
    assert 'distributed_executor_backend = "mp"' in st["reason"]
    assert st["nodes"]["spark-2"]["image"]["summary"] == "no ray, no vllm"
    assert not d.events("ray.container_started")
    for node in testbed.NODES:  # the check's own containers are gone too
        assert containers(node) == {}, containers(node)
    checked = d.events("image.checked")
    assert sorted(e["node"] for e in checked) == ["spark-1", "spark-2"]
    # `check --preflight` already looked at this very image (same ID, same spec): not looked at again.
    assert all(e.get("kept") for e in checked), checked


def test_a_ray_without_its_dashboard_is_read_through_its_gcs(supervisor: Callable[..., Supervisor],
                                                             tmp_path: Path) -> None:
    ray = testbed.ray_without_dashboard()
    config = write_config(tmp_path, deployment={"ray": {"command": [str(ray), "start"]}})
    d = supervisor(config)
    d.wait_phase("SERVING", 240)
    st = verify_serving(d)
    assert st["ray"]["via"] == "gcs" and st["ray"]["nodes_alive"] == 2 and st["ray"]["gpus"] == 2.0, st["ray"]
    checked = {e["node"]: e for e in d.events("image.checked")}
    assert set(checked) == {"spark-1", "spark-2"} and not any(e["dashboard"] for e in checked.values())
    assert "without dashboard" in st["nodes"]["spark-1"]["image"]["summary"]
    head = containers("spark-1")[OWNED["spark-1"]]
    assert "spark-supervisor.ray-state=gcs" in head["labels"]
    # The Ray path's evidence still works without the dashboard: a worker's Ray container removed is a
    # gang repair, and it serves again.
    testbed.docker("spark-2", "rm", "-f", OWNED["spark-2"])
    d.wait(lambda s: s["phase"] != "SERVING", 60, "the loss seen")
    d.wait(lambda s: s["phase"] == "SERVING" and len(d.repairs()) == 1, 240, "SERVING after one gang repair")
    assert d.repairs()[0]["kind"] == "gang"
    verify_serving(d)
