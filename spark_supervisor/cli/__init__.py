# PYTHON_ARGCOMPLETE_OK  (argcomplete's marker: this entry point answers completion requests)
"""Composition root: parse arguments, wire the real adapters, run a command.

Heavy modules (docker, httpx, argcomplete) are imported only by the commands that need them, so `status`
and `check` answer fast. `main` (the console entry point, spark_supervisor.cli:main) and the parser are in
main.py; what every command shares (exit codes, `_load`) in base.py; the commands in one module per group:
status.py, ops.py (check, diagnose, run, plan, teardown, reset), maintenance.py (pause, resume), logs.py,
tools.py (logscan, version, completion, schema). Nothing here imports back up from the rest of the package
at import time, and nothing in the rest of the package imports the CLI.
"""

from __future__ import annotations

from .base import (
    DEFAULT_CONFIG,
    ENVIRONMENT,
    EX_CONFIG,
    EXIT_CONFIG,
    EXIT_NOTE,
    ST_DEGRADED,
    ST_FAILED,
    ST_NOT_RUNNING,
    ST_PAUSED,
    ST_SERVING,
    ST_UNKNOWN,
    STATUS_CODES,
    STATUS_NOTE,
    SYSTEM_CONFIG,
    TRANSITIONAL,
)
from .main import main, parser
from .status import status_code

__all__ = ["DEFAULT_CONFIG", "ENVIRONMENT", "EXIT_CONFIG", "EXIT_NOTE", "EX_CONFIG", "STATUS_CODES", "STATUS_NOTE",
           "ST_DEGRADED", "ST_FAILED", "ST_NOT_RUNNING", "ST_PAUSED", "ST_SERVING", "ST_UNKNOWN", "SYSTEM_CONFIG",
           "TRANSITIONAL", "main", "parser", "status_code"]
