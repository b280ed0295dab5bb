"""The logger every layer is handed: structlog's bound logger (report.journal sets up where its events go).
Typed by structlog's own protocol, so a call of a level it lacks, or a logger of another kind, is mypy's to
find."""

from __future__ import annotations

from structlog.typing import FilteringBoundLogger as Log

__all__ = ["Log"]
