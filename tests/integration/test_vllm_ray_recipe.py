"""The shipped recipe for an image with Ray (etc/vllm-ray.Dockerfile), built on the testbed and held to the image
check the daemon runs before a first start: what an owner builds from it is an image the Ray backend accepts.

Offline, as CI is: the recipe's own `pip install 'ray[default]==…'` runs with no network, from a local stand-in
for the vLLM base and a wheel directory inside it (spark_testbed/rayimage.py says how both are made)."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

from spark_testbed import rayimage, testbed
from spark_testbed.harness import BIN, containers, write_config


def test_the_recipe_builds_an_image_with_ray_that_the_image_check_accepts(clean: None, tmp_path: Path) -> None:
    started = time.monotonic()
    built = rayimage.build()
    assert built.returncode == 0, (built.stdout + built.stderr).decode()[-3000:]
    # Built once, loaded on the other node as the recipe's header says: the same image ID on both.
    image_id = rayimage.load(rayimage.BUILT, "spark-1", "spark-2")
    assert image_id and rayimage.image_id("spark-2", rayimage.BUILT) == image_id
    version = rayimage.ray_version()

    # The image in a deployment on the Ray backend: the testbed's, with the image's own `ray` and `vllm`.
    config = write_config(tmp_path, deployment={"ray": {
        "image": rayimage.BUILT, "command": ["ray", "start"], "volumes": [f"{testbed.DIR}:{testbed.DIR}:ro"],
        "env": {"PATH": "/opt/venv/bin:/usr/bin:/bin"}}, "serve": {"command": ["vllm", "serve"]}})
    out = subprocess.run([str(BIN / "spark-supervisor"), "check", "--preflight", "--config", str(config)],
                         capture_output=True, text=True, timeout=180)
    said = out.stdout + out.stderr
    assert out.returncode == 0 and said.rstrip().endswith("preflight: OK"), said
    for node in testbed.NODES:
        line = next(x for x in said.splitlines() if x.startswith(f"image {rayimage.BUILT} on {node}: "))
        assert re.fullmatch(rf".*: ray {re.escape(version)} \(with dashboard, Python 3\.\d+\.\d+\), "
                            rf"vllm {re.escape(rayimage.VLLM_VERSION)}", line), line
        assert containers(node) == {}  # the check's own containers are gone
    assert "ImageLacksRay" not in said
    # The check reads package metadata only; Ray itself imports and runs in the image (all its dependencies).
    ran = testbed.docker("spark-1", "run", "--rm", "--network", "none", rayimage.BUILT, "ray", "--version")
    assert ran.stdout.decode().strip() == f"ray, version {version}"
    elapsed = time.monotonic() - started
    print(f"recipe build, load and image check: {elapsed:.1f} s")
