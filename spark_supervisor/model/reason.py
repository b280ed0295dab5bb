"""Why a phase is what it is."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Reason:
    """Why: a kind (a CamelCase tag that metrics, alerts, chaos and tests match on; "" for a plain note of
    progress) and its details, rendered to text only at the edge (status, logs, STATUS=)."""

    kind: str = ""
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}" if self.kind and self.detail else self.kind or self.detail
