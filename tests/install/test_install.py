"""spark-supervisor installs like a tool: the wheel `make wheel` builds from this tree holds the daemon
alone (no testbed, no Ray), and installed into a fresh venv, its dependencies from the package index,
it runs: --version, `check` of the testbed config, `status --json` with and without a daemon.

The testbed itself is not needed (only its config's variables): nothing here touches the nodes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from spark_supervisor.loop.daemon import lock_state_dir
from spark_testbed import testbed

ROOT = Path(__file__).resolve().parents[2]
TESTBED_SCRIPTS = {"spark-testbed", "spark-testbed-vllm", "spark-testbed-nvidia-smi", "spark-testbed-chaos"}

pytestmark = pytest.mark.timeout(900)  # the usual ~30 s (pip's cache); a cold cache downloads ~70 MB


@dataclass
class Installed:
    wheel: Path
    venv: Path

    def run(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.venv / "bin" / "spark-supervisor"), *args], capture_output=True, text=True,
                              timeout=60, env={**os.environ, **(env or {})}, cwd=self.venv)


def run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{' '.join(argv)}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return p


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    tmp = tmp_path_factory.mktemp("install")
    # -o venv: the dev venv is what runs this test; the wheel's recipe is the one `make install` uses
    run(["make", "-s", "-C", str(ROOT), "-o", "venv", "wheel", f"DIST={tmp / 'dist'}"], 300)
    wheel, = (tmp / "dist").glob("spark_supervisor-*.whl")
    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", str(venv)], 120)
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)], 840)
    yield Installed(wheel, venv)


def test_the_wheel_holds_the_daemon_alone(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as z:
        names = z.namelist()
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        scripts = z.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert {n.split("/")[0] for n in names if "/" in n and ".dist-info/" not in n and ".data/" not in n} \
        == {"spark_supervisor"}
    assert not [n for n in names if "spark_testbed" in n]
    assert "spark-supervisor = spark_supervisor.cli:main" in scripts
    assert not TESTBED_SCRIPTS & {line.split(" = ")[0] for line in scripts.splitlines()}
    assert any(n.endswith("/share/man/man1/spark-supervisor.1") for n in names)
    requires = [line.split(": ", 1)[1] for line in meta.splitlines() if line.startswith("Requires-Dist: ")]
    runtime = [r for r in requires if "extra ==" not in r]
    print("\nRequires-Dist (runtime):\n  " + "\n  ".join(runtime))
    assert not [r for r in runtime if r.split("[")[0].split(">")[0] in ("ray", "psutil", "tomli-w")]
    found = subprocess.run([str(installed.venv / "bin" / "python"), "-c",
                            "import importlib.util as u; print([m for m in ('spark_testbed', 'ray', 'psutil') "
                            "if u.find_spec(m)])"], capture_output=True, text=True, timeout=60,
                           cwd=installed.venv)  # not this tree: `python -c` puts the cwd on sys.path
    assert found.stdout.strip() == "[]", found.stderr
    assert not TESTBED_SCRIPTS & {p.name for p in (installed.venv / "bin").iterdir()}
    assert (installed.venv / "share" / "man" / "man1" / "spark-supervisor.1").is_file()


def test_the_installed_tool_runs(installed: Installed, tmp_path: Path) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert installed.run("--version").stdout == f"spark-supervisor {version}\n"
    out = subprocess.run([str(installed.venv / "bin" / "python"), "-m", "spark_supervisor", "--version"],
                         capture_output=True, text=True, timeout=60, cwd=installed.venv)
    assert out.stdout == f"spark-supervisor {version}\n", out.stderr

    check = installed.run("check", "-c", str(ROOT / "etc" / "testbed.toml"), env=testbed.env())
    assert check.returncode == 0 and "OK: deployment 'testbed'" in check.stdout, check.stderr

    state = tmp_path / "state"
    state.mkdir()
    none = installed.run("--json", "status", "--state-dir", str(state))
    got = json.loads(none.stdout)
    assert none.returncode == 3 and got["running"] is False and got["phase"] is None, none.stderr
    (state / "status.json").write_text(json.dumps({"phase": "SERVING", "reason": "", "deployment":
                                                   {"name": "testbed", "required": True}}))
    fd = lock_state_dir(str(state))  # as the running daemon holds it
    try:
        serving = installed.run("status", "--json", "--state-dir", str(state))
    finally:
        os.close(fd)
    got = json.loads(serving.stdout)
    assert serving.returncode == 0 and got["running"] is True and got["phase"] == "SERVING", serving.stderr

    schema = installed.run("schema")
    assert schema.returncode == 0 and "deployments" in json.loads(schema.stdout)["properties"]
    completion = installed.run("completion", "bash")
    assert completion.returncode == 0 and "complete " in completion.stdout and "spark-supervisor" in completion.stdout
