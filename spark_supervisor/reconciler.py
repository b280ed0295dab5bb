"""One deployment's reconcile loop: moved to ``spark_supervisor.loop.reconciler`` (its trackers to
``spark_supervisor.loop.tracking``); this path stays importable."""

from __future__ import annotations

from .loop.reconciler import Reconciler

__all__ = ["Reconciler"]
