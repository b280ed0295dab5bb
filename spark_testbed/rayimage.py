"""etc/vllm-ray.Dockerfile built on the testbed, offline: the recipe's own `pip install 'ray[default]==…'`, from a
local base image instead of NVIDIA's vLLM image and from a wheel directory inside that base instead of PyPI (CI
reaches neither a registry nor PyPI).

The base (`spark-testbed/vllm-base`) stands in for a vLLM image: the testbed's Debian with Python 3.11 (the
systemd image, already built for the systemd tests), a venv whose `python3` is what the recipe installs into, a
`vllm` that answers `--version`, and in /wheels Ray and every package `ray[default]` needs, repacked from this
venv's installed copies (Ray's wheel is not built from source, and `pip wheel`/`pip download` need an index).
The built image is then loaded onto the other node, as an owner does with `docker save | docker load`.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import re
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from . import testbed

RECIPE = testbed.SRC / "etc" / "vllm-ray.Dockerfile"
BASE = "spark-testbed/vllm-base:latest"
BUILT = "spark-testbed/vllm-ray:latest"
VLLM_VERSION = "0.33.0"  # what the base's `vllm --version` prints (etc/testbed.toml's stand-in says the same)
WHEELS = "/wheels"  # the wheel directory inside the base image
PIP_ARGS = f"--no-index --find-links {WHEELS}"

BASE_DOCKERFILE = f"""FROM {testbed.SYSTEMD}
RUN python3 -m venv /opt/venv && printf '#!/bin/sh\\necho {VLLM_VERSION}\\n' > /opt/venv/bin/vllm \\
 && chmod 755 /opt/venv/bin/vllm
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
COPY wheels {WHEELS}
CMD ["sh"]
"""


def ray_version() -> str:
    return md.version("ray")


def closure(requirement: str) -> dict[str, md.Distribution]:
    """The installed distributions ``requirement`` needs, itself included (markers and extras evaluated here)."""
    found: dict[str, tuple[md.Distribution, set[str]]] = {}
    todo = [Requirement(requirement)]
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        dist, extras = found.get(name) or (md.distribution(req.name), set())
        if name in found and set(req.extras) <= extras:
            continue
        extras |= set(req.extras)
        found[name] = (dist, extras)
        for line in dist.requires or ():
            dep = Requirement(line)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in (extras or {""})):
                todo.append(dep)
    return {n: d for n, (d, _) in found.items()}


def _tags(wheel_meta: str) -> str:
    """The compressed tag of a wheel's file name from its WHEEL file's Tag lines (cp311-cp311-a.b)."""
    parts: list[list[str]] = [[], [], []]
    for line in wheel_meta.splitlines():
        if line.startswith("Tag:"):
            for seen, part in zip(parts, line.split(":", 1)[1].strip().split("-", 2), strict=True):
                if part not in seen:
                    seen.append(part)
    return "-".join(".".join(p) for p in parts)


def repack(dist: md.Distribution, dest: Path) -> Path:
    """A wheel of an installed distribution, from the files its RECORD lists: the package as installed, its
    .dist-info, and what it put outside site-packages (py-spy's binary) as the wheel's data. Console scripts
    are left out: pip writes them again from entry_points.txt, with the target's own interpreter."""
    info = next(f for f in dist.files or () if f.name == "METADATA").parent  # ray-2.60.0.dist-info
    entry = {ep.name for ep in dist.entry_points if ep.group in ("console_scripts", "gui_scripts")}
    data = f"{info.name.removesuffix('.dist-info')}.data"
    name = re.sub(r"[-_.]+", "_", dist.metadata["Name"])
    out = dest / f"{name}-{dist.version}-{_tags(dist.read_text('WHEEL') or '')}.whl"
    record: list[str] = []
    tmp = out.with_suffix(".part")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
        for f in dist.files or ():
            parts = f.parts
            if "__pycache__" in parts or (parts[0] == info.name and f.name in ("RECORD", "INSTALLER", "REQUESTED",
                                                                               "direct_url.json")):
                continue
            if parts[0] == "..":  # under the prefix: bin/<script> or another data directory
                rest = [p for p in parts if p != ".."]
                if rest[0] == "bin" and (len(rest) != 2 or rest[1] in entry):
                    continue
                arc = f"{data}/{'scripts' if rest[0] == 'bin' else 'data'}/{'/'.join(rest[1:] if rest[0] == 'bin' else rest)}"
            else:
                arc = str(PurePosixPath(*parts))
            body = Path(str(dist.locate_file(f))).read_bytes()
            z.writestr(arc, body)
            digest = base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()
            record.append(f"{arc},sha256={digest},{len(body)}")
        record.append(f"{info.name}/RECORD,,")
        z.writestr(f"{info.name}/RECORD", "\n".join(record) + "\n")
    tmp.rename(out)
    return out


def wheelhouse() -> Path:
    """Wheels of `ray[default]` at this venv's Ray version and all it needs, made once under the testbed
    directory (about 290 MB, 20 s)."""
    version = ray_version()
    dest = testbed.DIR / f"ray-wheels-{version}"
    marker = dest / ".complete"
    if marker.exists():
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for dist in closure(f"ray[default]=={version}").values():
        repack(dist, dest)
    marker.touch()
    return dest


def _label(node: str, image: str, key: str) -> str:
    r = testbed.docker(node, "image", "inspect", "--format", f'{{{{index .Config.Labels "{key}"}}}}', image,
                       check=False)
    return r.stdout.decode().strip() if r.returncode == 0 else ""


def image_id(node: str, image: str) -> str:
    r = testbed.docker(node, "image", "inspect", "--format", "{{.Id}}", image, check=False)
    return r.stdout.decode().strip() if r.returncode == 0 else ""


def base_image(node: str = "spark-1") -> str:
    """The stand-in vLLM base on ``node``'s engine, built once (again when its recipe or the wheels change)."""
    wheels = wheelhouse()
    names = sorted(p.name for p in wheels.glob("*.whl"))
    key = hashlib.sha256("\n".join([BASE_DOCKERFILE, *names]).encode()).hexdigest()[:16]
    if _label(node, BASE, "spark-testbed.base") == key:
        return BASE
    testbed.systemd_image(node)
    with tempfile.TemporaryDirectory(dir=testbed.DIR) as ctx:
        shutil.copytree(wheels, Path(ctx) / "wheels")
        (Path(ctx) / "Dockerfile").write_text(BASE_DOCKERFILE)
        testbed.docker(node, "build", "--network", "none", "--label", f"spark-testbed.base={key}", "-t", BASE, ctx,
                       timeout=600)
    return BASE


def build(node: str = "spark-1", recipe: Path = RECIPE, tag: str = BUILT) -> subprocess.CompletedProcess[bytes]:
    """etc/vllm-ray.Dockerfile built on ``node`` as an owner runs it (the Dockerfile on stdin, no context), from the
    stand-in base and its wheels, with no network at all, at the recipe's own Ray version (its wheels are this
    venv's Ray: tests/unit/test_config.py holds the two equal). Docker's layer cache makes a rebuild of an unchanged
    recipe a second or two."""
    base_image(node)
    return testbed.docker(node, "build", "--network", "none", "--build-arg", f"BASE={BASE}",
                          "--build-arg", f"PIP_ARGS={PIP_ARGS}",
                          "-t", tag, "-", input=recipe.read_bytes(), timeout=600, check=False)


def load(image: str, source: str, target: str) -> str:
    """``image`` copied from one node's engine to another's (`docker save | docker load`), unless the target
    already holds the same image ID; returns that ID."""
    want = image_id(source, image)
    if want and image_id(target, image) != want:
        with subprocess.Popen(["docker", "-H", f"unix://{testbed.sock(source)}", "save", image],
                              stdout=subprocess.PIPE) as save:
            subprocess.run(["docker", "-H", f"unix://{testbed.sock(target)}", "load"], stdin=save.stdout,
                           capture_output=True, check=True, timeout=300)
            if save.wait(timeout=60) != 0:
                raise RuntimeError(f"docker save {image} on {source}: exit {save.returncode}")
    return want
