"""The daemon: moved to the ``spark_supervisor.loop`` package (the process shell in ``loop.daemon``, the
stack of reconcilers in ``loop.stack``, its reloads in ``loop.reload``, the systemd and status-file
reporter in ``loop.reporting``); this path stays importable."""

from __future__ import annotations

from .loop.daemon import AlreadyRunning, Daemon, StateDirUnfit, lock_state_dir
from .retry import backoff_delay

__all__ = ["AlreadyRunning", "Daemon", "StateDirUnfit", "backoff_delay", "lock_state_dir"]
