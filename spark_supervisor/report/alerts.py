"""Alerts: tell someone outside when a deployment enters FAILED or DEGRADED, is repaired, recovers, or the
daemon is paused or resumed. The unit stays "active (running)" through all of these, so nothing else would.

The reconcile loop only calls ``Alerter.emit``, which decides (rate limit) and queues; one background
thread sends: a webhook (a small JSON document POSTed with httpx) and/or a command (argv, the same
document on its standard input), each retried with tenacity and bounded by a timeout. A slow or dead
receiver never holds the loop up.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import tenacity

from ..base import redaction
from ..base.log import Log
from ..config import Alerts
from ..model.document import JSON

# Queued alerts beyond this are dropped (and logged): a receiver down for hours must not grow us.
QUEUE_MAX = 64
# All the alert command gets of the daemon's environment (which holds HF_TOKEN, the API key's variable, ...).
COMMAND_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
COMMAND_PASSED = ("HOME", "TZ")


@dataclass
class RateLimit:
    """The same event of the same deployment at most once per ``min_interval``; what is held back is counted
    and reported with the next one that goes out. Pure: the caller gives the time."""

    min_interval: float
    last: dict[tuple[str, str], float] = field(default_factory=dict)
    held: dict[tuple[str, str], int] = field(default_factory=dict)

    def allow(self, key: tuple[str, str], now: float) -> tuple[bool, int]:
        """(send it?, how many were held back since the last one sent)."""
        then = self.last.get(key)
        if then is not None and now - then < self.min_interval:
            self.held[key] = self.held.get(key, 0) + 1
            return False, 0
        self.last[key] = now
        return True, self.held.pop(key, 0)


webhook_label = redaction.url_origin  # the webhook in logs and errors: never its credentials, path or query


class _Rejected(Exception):
    pass


class Alerter:
    def __init__(self, cfg: Alerts, *, log: Log, on_sent: Callable[[str, str, str, bool], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time):
        self.cfg, self.log, self.clock, self.wall = cfg, log, clock, wall
        self.on_sent = on_sent or (lambda *_: None)
        self.host = socket.gethostname()
        self.limit = RateLimit(cfg.min_interval)
        self.dropped = 0
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue(QUEUE_MAX)
        self._thread: threading.Thread | None = None
        if cfg.enabled:
            self._thread = threading.Thread(target=self._work, daemon=True, name="alerts")
            self._thread.start()

    def emit(self, deployment: str, event: str, *, phase: str, reason: str, reason_kind: str = "",
             **extra: JSON) -> dict[str, Any] | None:
        """Queue an alert if it is configured, wanted and not rate limited; returns the document queued."""
        if not self.cfg.enabled or event not in self.cfg.events:
            return None
        send, held = self.limit.allow((deployment, event), self.clock())
        if not send:
            self.log.info("alert.held", alert=event, reason_kind=reason_kind, min_interval_s=self.cfg.min_interval)
            return None
        doc = {"source": "spark-supervisor", "host": self.host, "event": event, "deployment": deployment,
               "phase": phase, "reason": reason, "reason_kind": reason_kind,
               "at": datetime.fromtimestamp(self.wall(), UTC).isoformat(timespec="seconds"),
               "summary": f"{self.host} {deployment}: {event}" + (f": {reason}" if reason else ""),
               "held_back": held, **extra}
        try:
            self._queue.put_nowait(doc)
        except queue.Full:
            self.dropped += 1
            self.log.error("alert.dropped", alert=event, queued=QUEUE_MAX, dropped=self.dropped)
            return None
        return doc

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (within ``timeout``), then stop the thread."""
        if self._thread is None:
            return
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._thread.join(timeout)
        self._thread = None

    # ------------------------------------------------------------------------------ the sending thread
    def _work(self) -> None:
        while True:
            doc = self._queue.get()
            if doc is None:
                return
            try:
                if self.cfg.webhook:
                    self._deliver(doc, "webhook", self._post)
                if self.cfg.command:
                    self._deliver(doc, "command", self._run)
            except Exception as e:  # a bug here must not end the sending thread and leave alerts to pile up
                self.log.exception("alert.crashed", error=f"{type(e).__name__}: {e}"[:300])

    def _deliver(self, doc: dict[str, Any], via: str, send: Callable[[dict[str, Any]], None]) -> None:
        retrying = tenacity.Retrying(stop=tenacity.stop_after_attempt(self.cfg.attempts),
                                     wait=tenacity.wait_random_exponential(multiplier=0.5, max=10), reraise=True)
        try:
            retrying(send, doc)
        except Exception as e:  # whatever a receiver does, the loop goes on; the operator sees it in the log
            error = redaction.text(f"{type(e).__name__}: {e}", redaction.url_secrets(self.cfg.webhook))
            self.log.error("alert.failed", alert=doc["event"], via=via, attempts=self.cfg.attempts,
                           error=error[:300])
            self.on_sent(doc["deployment"], doc["event"], via, False)
            return
        self.log.info("alert.sent", alert=doc["event"], via=via)
        self.on_sent(doc["deployment"], doc["event"], via, True)

    def _post(self, doc: dict[str, Any]) -> None:
        try:
            r = httpx.post(self.cfg.webhook, json=doc, timeout=self.cfg.timeout)
        except Exception as e:  # httpx quotes the URL in some errors: only the kind, the cause without the URL
            why = redaction.text(str(e), redaction.url_secrets(self.cfg.webhook))[:200]
            raise _Rejected(f"{webhook_label(self.cfg.webhook)}: {type(e).__name__}"
                            + (f": {why}" if why else "")) from None
        if not r.is_success:
            raise _Rejected(f"{webhook_label(self.cfg.webhook)} answered HTTP {r.status_code}")

    def _run(self, doc: dict[str, Any]) -> None:
        env = {"PATH": COMMAND_PATH, "LANG": "C.UTF-8",
               **{k: os.environ[k] for k in COMMAND_PASSED if k in os.environ},
               "SPARK_ALERT_EVENT": doc["event"], "SPARK_ALERT_DEPLOYMENT": doc["deployment"],
               "SPARK_ALERT_SUMMARY": doc["summary"]}
        try:
            done = subprocess.run(self.cfg.command, input=json.dumps(doc) + "\n", text=True, errors="backslashreplace",
                                  capture_output=True, timeout=self.cfg.timeout, env=env, check=False)
        except subprocess.TimeoutExpired:  # its str() quotes the whole argv, which may hold a token
            raise _Rejected(f"{self.cfg.command[0]}: timed out after {self.cfg.timeout:g}s") from None
        except OSError as e:
            raise _Rejected(f"{self.cfg.command[0]}: {type(e).__name__}: {e.strerror or e.errno}") from None
        if done.returncode != 0:
            raise _Rejected(f"{self.cfg.command[0]} exited {done.returncode}: {done.stderr.strip()[-200:]}")
