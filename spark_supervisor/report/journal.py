"""structlog set-up. Under journald each event is one journal entry sent with the native protocol: its priority
from the level (so `journalctl -p warning` works) and its event, deployment, node and phase as fields
(`journalctl EVENT=phase.changed`), the whole event as JSON in JSON=. Elsewhere one JSON line per event on
stderr, or a readable line on a terminal."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, TextIO

import structlog

from ..base import redaction
from ..base.log import Log

if TYPE_CHECKING:
    from ..config import Config

IDENTIFIER = "spark-supervisor"
SOCKET = "/run/systemd/journal/socket"
# syslog(3) priorities, as journald and `journalctl -p` know them.
PRIORITY = {"critical": 2, "fatal": 2, "error": 3, "exception": 3, "warning": 4, "warn": 4, "notice": 5,
            "info": 6, "debug": 7}
# Event keys that become journal fields of their own (`to` is the new phase in phase.changed).
FIELDS = (("event", "EVENT"), ("deployment", "DEPLOYMENT"), ("node", "NODE"), ("phase", "PHASE"), ("to", "PHASE"))
# One datagram carries the entry; past the socket's send buffer (~208 KiB by default) journald needs a memfd,
# which a sandbox may refuse. Our events are small, so an oversized one is cut instead.
MAX_MESSAGE = 8 * 1024
MAX_JSON = 64 * 1024
MAX_TRACEBACK = 64 * 1024
SEND_TIMEOUT_S = 0.5  # a journald that does not drain its socket must not stall a reconcile tick
RETRY_SOCKET_S = 30.0  # after a failed send, stderr (with a <N> prefix) for this long before trying again
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-/:@,+%")


# ------------------------------------------------------------------------------------------- secrets
# Whatever a caller forgot, no log line carries a secret: the values registered here (the API keys, secret
# environment values) and a URL's credentials are replaced in every string of every event.
MAX_SECRETS = 256  # keys rotated by reloads stay hidden; a bound all the same
_secrets: tuple[str, ...] = ()
_secrets_lock = threading.Lock()


def register_secret(*values: str) -> None:
    """Never log these values (too short to be a secret, under 4 characters: ignored)."""
    global _secrets
    with _secrets_lock:
        new = [v for v in (str(x).strip() for x in values) if len(v) >= 4 and v not in _secrets]
        if new:  # longest first: a secret holding another is replaced whole
            _secrets = tuple(sorted({*_secrets, *new}, key=len, reverse=True)[:MAX_SECRETS])


def register_environment(env: Mapping[str, str]) -> None:
    """The values of the secret-named variables (HF_TOKEN, *_API_KEY, ...) of an environment."""
    register_secret(*(v for k, v in env.items() if redaction.secret_env(k)))


def register_config(cfg: Config) -> None:
    """Every secret the config knows of (config.known_secrets: the API keys, secret-named env values, secret
    flags' values, the webhook's credentials and token-like path segments, the alert command's arguments)."""
    from ..config import known_secrets
    register_secret(*known_secrets(cfg, {}))


def _scrub(v: object) -> object:
    if isinstance(v, str):
        return redaction.scrub(v, _secrets)
    if isinstance(v, dict):
        return {k: _scrub(x) for k, x in v.items()}
    # these exactly: a subclass (a namedtuple) is not built from one iterable
    if isinstance(v, list | tuple | set | frozenset) and type(v) in (list, tuple, set, frozenset):
        return type(v)(_scrub(x) for x in v)
    return v


def redact(_: object, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """The structlog processor: after format_exc_info, so that a traceback is scrubbed too."""
    for k, v in event.items():
        event[k] = _scrub(v)
    return event


def priority(level: str | None) -> int:
    return PRIORITY.get((level or "info").lower(), 6)


def _value(v: object) -> str:
    if isinstance(v, str):
        return v if v and set(v) <= _PLAIN else json.dumps(v, ensure_ascii=False)
    return json.dumps(v, ensure_ascii=False, default=str, separators=(",", ":"))


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit} more characters)"


def message(event: Mapping[str, Any]) -> str:
    """One readable line: the event name, then key=value for the rest (the time and level are the journal's
    own; an exception by its last line only, the traceback has a field of its own)."""
    parts = [str(event.get("event", ""))]
    for k, v in event.items():
        if k in ("event", "level", "timestamp"):
            continue
        if k == "exception" and isinstance(v, str):
            v = v.strip().splitlines()[-1] if v.strip() else v
        parts.append(f"{k}={_value(v)}")
    return _cut(" ".join(parts).replace("\n", " "), MAX_MESSAGE)


def to_json(event: Mapping[str, Any]) -> str:
    """The whole event, as one JSON line (what stderr carries off journald); kept valid when cut."""
    text = json.dumps(event, ensure_ascii=False, default=str)
    if len(text) <= MAX_JSON:
        return text
    keep = {k: event[k] for k in ("timestamp", "level", "event", "deployment", "node") if k in event}
    return json.dumps({**keep, "truncated": len(text)}, ensure_ascii=False, default=str)


def journal_fields(event: Mapping[str, Any]) -> list[tuple[str, str | int]]:
    """The journal entry for one event: MESSAGE, PRIORITY, SYSLOG_IDENTIFIER, the queryable fields, the
    traceback if any and the whole event as JSON."""
    out: list[tuple[str, str | int]] = [("MESSAGE", message(event)), ("PRIORITY", priority(event.get("level"))),
                                        ("SYSLOG_IDENTIFIER", IDENTIFIER)]
    seen = set()
    for key, field in FIELDS:
        v = event.get(key)
        if v is not None and field not in seen:
            seen.add(field)
            out.append((field, _cut(str(v), 1024)))
    tb = event.get("exception")
    if isinstance(tb, str) and tb:
        out.append(("TRACEBACK", _cut(tb, MAX_TRACEBACK)))
    out.append(("JSON", to_json(event)))
    return out


def journal_stream_is_stderr(value: str | None, st: os.stat_result | None) -> bool:
    """JOURNAL_STREAM is "<st_dev>:<st_ino>" of the stream systemd connected; if stderr is still that stream
    this process's log goes to journald (a child whose stderr was redirected inherits the variable but not
    the stream)."""
    if not value or st is None:
        return False
    dev, _, ino = value.partition(":")
    try:
        return (int(dev), int(ino)) == (st.st_dev, st.st_ino)
    except ValueError:
        return False


def under_journald() -> bool:
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        st = None
    return journal_stream_is_stderr(os.environ.get("JOURNAL_STREAM"), st)


class JournalSink:
    """Sends each event to journald over its native socket; when that fails (no socket, full queue, a
    sandbox), writes the JSON line to stderr with the sd-daemon "<N>" prefix, which journald turns into the
    priority. A logging failure never raises."""

    def __init__(self, socket_path: str | None = None, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.clock = clock
        self.retry_at = 0.0
        self.lock = threading.Lock()
        self.transport: Any = None
        try:
            from logging_journald import JournaldTransport
            # Unconnected: the path is looked up on each send, as libsystemd does, so a restarted journald
            # (a new socket at the same path) is found again without reconnecting.
            self.transport = JournaldTransport(socket_path=socket_path or SOCKET, connected=False)
            self.transport.socket.settimeout(SEND_TIMEOUT_S)
        except (ImportError, OSError):
            pass  # the "<N>" lines on stderr still carry the priority

    def close(self) -> None:
        if self.transport is not None:
            self.transport.socket.close()

    def emit(self, event: Mapping[str, Any]) -> None:
        try:
            fields = journal_fields(event)
            if self.transport is not None and self.clock() >= self.retry_at:
                try:
                    self.transport.send(fields)
                    return
                except OSError:
                    self.retry_at = self.clock() + RETRY_SOCKET_S
            line = f"<{priority(event.get('level'))}>{to_json(event)}\n"
            with self.lock:
                stream = self.stream or sys.stderr
                stream.write(line)
                stream.flush()
        except Exception:  # noqa: S110 - nowhere left to report it; the daemon goes on
            pass


class JournalLogger:
    """The structlog logger under journald: the last processor hands it the event dict."""

    def __init__(self, sink: JournalSink) -> None:
        self.sink = sink

    def msg(self, event: Mapping[str, Any]) -> None:
        self.sink.emit(event)

    debug = info = warning = warn = error = critical = exception = fatal = failure = err = log = msg


def _pass_event(_: object, __: str, event: MutableMapping[str, Any]) -> tuple[Any, ...]:
    return (event,), {}


sink: JournalSink | None = None  # the one setup() made, if any


def setup(json: bool | None = None, journal: bool | None = None) -> None:
    """journal: native journal entries (default: when stderr is journald's stream). Otherwise json: one JSON
    line per event on stderr (default: when stderr is not a terminal), else a readable line."""
    if journal is None:
        journal = json is None and under_journald()
    if json is None:
        json = not sys.stderr.isatty()
    register_environment(os.environ)
    common: list[Any] = [structlog.processors.add_log_level,
                         structlog.processors.TimeStamper(fmt="iso", utc=True),
                         structlog.processors.format_exc_info, redact]
    global sink
    if sink is not None:
        sink.close()
        sink = None
    if journal:
        sink = JournalSink()
        logger = JournalLogger(sink)
        structlog.configure(processors=[*common, _pass_event], logger_factory=lambda *_: logger,
                            cache_logger_on_first_use=True)
        return
    renderer: Any = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    structlog.configure(processors=[*common, renderer], logger_factory=structlog.PrintLoggerFactory(sys.stderr),
                        cache_logger_on_first_use=True)


def get(**ctx: object) -> Log:
    logger: Log = structlog.get_logger("spark-supervisor").bind(**ctx)
    return logger
