"""What every command of the CLI shares: the config's default path, the exit codes (`status`'s as
`systemctl status` gives them), the help texts built from them, and loading the config (`_load`).

Standard library only at import: the parser and `status` stay fast.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import Config

SYSTEM_CONFIG = "/etc/spark-supervisor/spark-supervisor.toml"
DEFAULT_CONFIG = os.environ.get("SPARK_SUPERVISOR_CONFIG", SYSTEM_CONFIG)
EXIT_CONFIG = 2  # `check` and the other commands: the config is unusable
EX_CONFIG = 78  # `run`: sysexits' EX_CONFIG; the unit's RestartPreventExitStatus=78 stops the restart loop

# `status` exit codes, as `systemctl status` and LSB init scripts' `status` give them (3 and 4 are LSB's;
# 150-199 are LSB's range for the application), so that scripts and monitoring can trust them.
ST_SERVING = 0  # every required deployment SERVING
ST_FAILED = 1  # a required deployment FAILED (given up: needs `reset` or a fix)
ST_NOT_RUNNING = 3  # no daemon holds the state directory's lock
ST_UNKNOWN = 4  # the status cannot be read (or the config naming the state directory cannot)
ST_DEGRADED = 150  # degraded or on its way: DEGRADED, BACKOFF and every start-up or repair phase
ST_PAUSED = 151  # maintenance (`pause`): observing, acting on nothing
TRANSITIONAL = frozenset({"DEGRADED", "BACKOFF", "DETECTING", "CLEANING", "WAITING", "STARTING_RAY",
                          "STARTING_VLLM", "LOADING", "VERIFYING", "STOPPING"})
STATUS_CODES = (
    (ST_SERVING, "every required deployment is SERVING"),
    (ST_FAILED, "a required deployment is FAILED"),
    (ST_NOT_RUNNING, "no daemon is running (a status file it left is still shown, marked as such)"),
    (ST_UNKNOWN, "the status cannot be read"),
    (ST_DEGRADED, "degraded or on its way: DEGRADED, BACKOFF, DETECTING, WAITING, CLEANING, STARTING_*, "
                  "LOADING, VERIFYING, STOPPING"),
    (ST_PAUSED, "PAUSED (maintenance)"),
)
STATUS_NOTE = ("Only the required deployments count (all of them when none is required). With --json the "
               "status document is printed in every case, with \"running\": true, false, or null when it "
               "cannot be told.")
EXIT_NOTE = ("0 done; 1 a check or a command failed; 2 the config is unusable (78 for `run`, so that systemd "
             "does not restart it). `status` exits as `systemctl status` and LSB init scripts do:")
ENVIRONMENT = (("SPARK_SUPERVISOR_CONFIG", f"the config file when no --config is given (else {SYSTEM_CONFIG})"),)


def _wrapped(text: str, indent: str = "", first: str = "") -> str:
    import textwrap
    return textwrap.fill(text, 100, initial_indent=first or indent, subsequent_indent=indent,
                         break_on_hyphens=False)


def _status_epilog(head: str = "exit status (as `systemctl status` and LSB init scripts):") -> str:
    return "\n".join([_wrapped(head)]
                     + [_wrapped(text, " " * 7, f"  {code:<4} ") for code, text in STATUS_CODES]
                     + [_wrapped(STATUS_NOTE)])


def state_dir_of(path: str) -> tuple[str, list[str]]:
    """Where the daemon of the config at ``path`` keeps its state, for the commands that only read or ask it
    (status, pause, resume, restart, reset): from the whole config when it is valid, else from its
    [supervisor] state_dir alone (or the default) -- with the config's problems, shown beside what runs, not
    instead of it (a mistyped file on disk while the daemon runs on the one it read last; a `${HF_TOKEN}` this
    shell does not have). SystemExit only when not even that can be read."""
    from .. import config
    from ..config.labels import MAX_CONFIG_BYTES
    from ..config.loader import _read
    from ..config.settings import Supervisor
    try:
        return config.load(path).supervisor.state_dir, []
    except config.ConfigError as e:
        problems = e.problems
    raw, why = _read(Path(path), MAX_CONFIG_BYTES)
    try:
        doc = tomllib.loads(raw.decode("utf-8")) if not why else None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
        doc = None
    sup = doc.get("supervisor") if isinstance(doc, dict) else None
    given = sup.get("state_dir") if isinstance(sup, dict) else None
    if doc is None or (given is not None and (not isinstance(given, str) or not given.startswith("/")
                                              or "${" in given)):
        for line in problems:
            print(line, file=sys.stderr)
        raise SystemExit(EXIT_CONFIG)
    return given or str(Supervisor.model_fields["state_dir"].default), problems


def _load(path: str, code: int = EXIT_CONFIG) -> Config:
    from .. import config
    try:
        return config.load(path)
    except config.ConfigError as e:
        for line in e.problems:
            print(line, file=sys.stderr)
        raise SystemExit(code) from None

