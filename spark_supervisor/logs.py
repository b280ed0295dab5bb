"""structlog set-up: one JSON line per event for journald, a readable renderer on a terminal."""

from __future__ import annotations

import sys
from typing import Any

import structlog


def setup(json: bool | None = None) -> None:
    if json is None:
        json = not sys.stderr.isatty()
    renderer: Any = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="iso", utc=True),
                    structlog.processors.format_exc_info,
                    renderer],
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )


def get(**ctx: Any) -> Any:
    return structlog.get_logger("spark-supervisor").bind(**ctx)
