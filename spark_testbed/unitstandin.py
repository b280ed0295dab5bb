"""Stand-ins for `systemctl` and `sysctl -w vm.drop_caches=3` on a testbed node, which has no systemd as PID 1
and shares the machine's kernel (spark_testbed.nonroot installs them). As the real ones: anyone may `show`,
only root may stop, disable or mask a unit or drop the page cache (a normal user is refused, as systemd's
polkit and /proc/sys refuse it). Every change is logged with the caller's uid, so that a test sees it came
through sudo. Stdlib only: it runs as the non-root user, who cannot read the dev venv's interpreter.

    python3 unitstandin.py systemctl <node dir> ARGS...
    python3 unitstandin.py sysctl <node dir> <gpu.json> ARGS...

<node dir>/units/<name>.service holds "<ActiveState> <UnitFileState>"; <node dir>/calls.log the changes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

NVIDIA_SMI = Path(__file__).resolve().parent / "nvidia_smi.py"


def _log(d: Path, argv: list[str]) -> None:
    with open(d / "calls.log", "a") as f:
        f.write(f"uid={os.geteuid()} {' '.join(argv)}\n")


def _state(d: Path, unit: str) -> tuple[str, str] | None:
    try:
        active, file_state = (d / "units" / unit).read_text().split()
    except (OSError, ValueError):
        return None
    return active, file_state


def systemctl(d: Path, args: list[str]) -> int:
    verb, rest = args[0], args[1:]
    units = [u for u in rest if not u.startswith("-")]
    if verb == "show":
        for i, unit in enumerate(units):
            st = _state(d, unit)
            load, active, file_state = ("loaded", *st) if st else ("not-found", "inactive", "")
            print(("\n" if i else "") + f"Id={unit}\nLoadState={load}\nActiveState={active}\nUnitFileState={file_state}")
        return 0
    if verb not in ("stop", "disable", "mask"):
        print(f"systemctl stand-in: {verb} is not stood in", file=sys.stderr)
        return 1
    if os.geteuid() != 0:
        print(f"Failed to {verb} {' '.join(units)}: Access denied", file=sys.stderr)
        return 4
    _log(d, ["systemctl", *args])
    for unit in units:
        st = _state(d, unit) or ("inactive", "disabled")
        new = {"stop": ("inactive", st[1]), "disable": (st[0], "disabled"), "mask": (st[0], "masked")}[verb]
        (d / "units" / unit).write_text(" ".join(new) + "\n")
    return 0


def sysctl(d: Path, gpu_state: str, args: list[str]) -> int:
    if args != ["-w", "vm.drop_caches=3"]:
        print(f"sysctl stand-in: {' '.join(args)} is not stood in", file=sys.stderr)
        return 1
    if os.geteuid() != 0:
        print("sysctl: permission denied on key \"vm.drop_caches\"", file=sys.stderr)
        return 255
    _log(d, ["sysctl", *args])
    r = subprocess.run([sys.executable, str(NVIDIA_SMI), "--state", gpu_state, "--drop-caches"], timeout=30,
                       check=False)
    if r.returncode == 0:
        print("vm.drop_caches = 3")
    return r.returncode


def main(argv: list[str] | None = None) -> int:
    a = sys.argv[1:] if argv is None else argv
    if a[0] == "systemctl":
        return systemctl(Path(a[1]), a[2:])
    return sysctl(Path(a[1]), a[2], a[3:])


if __name__ == "__main__":
    sys.exit(main())
