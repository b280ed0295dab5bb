"""`make install` reloads systemd only when the unit file changed, and `make uninstall` only when it removed
the unit (issue 44, item 5): a daemon-reload detaches the GPUs from running containers that are not
privileged (NVIDIA/nvidia-container-toolkit#48), so an upgrade over a serving model must not reload for
nothing. The Makefile's targets run here against temporary directories, with a systemctl that records its
arguments (the real one, under systemd, in tests/integration/test_systemd_pull.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def make(tmp: Path, target: str) -> tuple[str, list[str]]:
    """Run the target; (its output, the systemctl calls it made, one line each)."""
    bin_ = tmp / "bin"
    bin_.mkdir(exist_ok=True)
    calls = tmp / "systemctl.calls"
    fake = bin_ / "systemctl"
    fake.write_text(f'#!/bin/sh\necho "$*" >> "{calls}"\n')
    fake.chmod(0o755)
    calls.write_text("")
    dirs = {k: str(tmp / k.lower()) for k in ("UNIT_DIR", "PREFIX", "BINDIR", "MANDIR", "BASH_COMPLETION_DIR")}
    p = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), target, *(f"{k}={v}" for k, v in dirs.items())],
                       capture_output=True, text=True, timeout=60, check=False,
                       env={**os.environ, "PATH": f"{bin_}:{os.environ.get('PATH', '/usr/bin:/bin')}"})
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout, calls.read_text().splitlines()


def test_the_unit_is_installed_and_systemd_reloaded_only_when_the_file_changed(tmp_path: Path) -> None:
    unit = tmp_path / "unit_dir" / "spark-supervisor.service"
    _, calls = make(tmp_path, "install-unit")  # the first install: a new unit
    assert unit.read_bytes() == (ROOT / "systemd" / "spark-supervisor.service").read_bytes()
    assert calls == ["daemon-reload"]
    out, calls = make(tmp_path, "install-unit")  # the same version again (an upgrade that kept the unit)
    assert calls == [] and "unchanged: no systemctl daemon-reload" in out
    unit.write_text(unit.read_text().replace("TimeoutStartSec=5min", "TimeoutStartSec=1min"))  # an older unit
    _, calls = make(tmp_path, "install-unit")
    assert calls == ["daemon-reload"]
    assert unit.read_bytes() == (ROOT / "systemd" / "spark-supervisor.service").read_bytes()


def test_uninstall_disables_without_the_implied_reload_and_reloads_once_only_if_it_removed_the_unit(
        tmp_path: Path) -> None:
    make(tmp_path, "install-unit")
    _, calls = make(tmp_path, "uninstall")
    assert calls == ["disable --now --no-reload spark-supervisor", "daemon-reload"]
    assert not (tmp_path / "unit_dir" / "spark-supervisor.service").exists()
    _, calls = make(tmp_path, "uninstall")  # nothing was installed: nothing to reload
    assert calls == ["disable --now --no-reload spark-supervisor"]
