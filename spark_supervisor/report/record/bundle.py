"""`spark-supervisor report`: a support bundle, one tar.gz: each deployment's record (as text, with what changed
since the last good one), its history and its facts at the last bad verdict; the status the daemon wrote and
its last transitions; the serve logs' tails; and the config with its secrets removed.

No secret leaves in it: the config is rewritten from the file as written (its ${NAME} references unexpanded,
the API key files never read into it), secret-named values, the webhook's path and credentials and the
alert command's arguments removed; and every member is then redacted against every secret the daemon
knows (each deployment's API key and secret-named environment values, the webhook's parts) and those of
this process's environment. Sizes are bounded: each member at most MAX_MEMBER bytes, each log tail LOG_LINES
lines and LOG_BYTES bytes."""

from __future__ import annotations

import errno
import io
import json
import os
import secrets as tokens
import shlex
import stat
import sys
import tarfile
import tomllib
from datetime import UTC, datetime
from pathlib import Path

from ...base import files, redaction
from ...config import Config, known_secrets
from ...config.labels import MAX_CONFIG_BYTES
from ...config.view import DeploymentView, views
from ...state import records, statefile
from ...state.names import REPORTS, STATUS
from ...world import servelogs
from . import text
from .diff import diff

MAX_MEMBER = 4 << 20
LOG_LINES, LOG_BYTES = 2000, 256 << 10
MARK = redaction.MARK


def redacted_config(raw: object, key: str = "") -> object:
    """The config as written, its secrets removed: a secret-named key's value (but a file's path or a variable's
    name: ``*_file``, ``*_env``), the webhook but its origin, the alert command's arguments but its flags, a
    URL's credentials."""
    if isinstance(raw, dict):
        return {k: redacted_config(v, str(k)) for k, v in raw.items()}
    if key == "command" and isinstance(raw, list):
        return [str(a) if i == 0 or (str(a).startswith("-") and "=" not in str(a)) else MARK for i, a in enumerate(raw)]
    if isinstance(raw, list) and all(isinstance(v, str) for v in raw):  # an argv: a secret flag's value too
        return [redacted_config(v) for v in redaction.argv(raw)]
    if isinstance(raw, list):
        return [redacted_config(v) for v in raw]
    if not isinstance(raw, str) or not raw:
        return raw
    if key == "extra_args":  # a string, split as the loader splits it: its secret flags' values hidden
        try:
            return shlex.join(redaction.argv(shlex.split(raw)))
        except ValueError:
            return MARK
    if key == "webhook":
        return f"{redaction.url_origin(raw)}/{MARK}"
    if redaction.secret_env(key) and not key.endswith(("_file", "_env")):
        return MARK
    return redaction.url(raw) if "://" in raw else raw


def _config(path: str) -> bytes:
    """The config file, its secrets removed, as JSON (read bounded, refusing anything but a regular file)."""
    raw = tomllib.loads(files.read_text(path, MAX_CONFIG_BYTES))
    return json.dumps(redacted_config(raw), indent=1).encode()


def _status(state_dir: str) -> tuple[bytes, bytes]:
    """The status file as the daemon wrote it, and each deployment's transitions in a line each."""
    doc = statefile.read(state_dir)
    lines = []
    for d in doc.get("deployments") or [doc]:
        lines.append(f"== {d.get('deployment', {}).get('name', '?')}: {d.get('phase')} since {d.get('since')}")
        lines += [f"{h.get('at')} {h.get('phase')}" + (f": {h.get('reason')}" if h.get("reason") else "")
                  for h in d.get("history") or []]
    return json.dumps(doc, indent=1).encode(), ("\n".join(lines) + "\n").encode()


def _records(view: DeploymentView) -> list[tuple[str, bytes]]:
    """A deployment's history, its facts at the last bad verdict, and its record as text against the last good."""
    last = records.latest(view.state_dir, view.name)
    bad, _ = records.read_bad(view.state_dir, view.name)
    out = [(f"{view.name}/records.jsonl", "".join(json.dumps(r) + "\n" for r in last.history.records).encode())]
    if bad is not None:
        out.append((f"{view.name}/record-bad.json", json.dumps(bad, indent=1).encode()))
    said = [f"problem: {p}" for p in last.problems]
    if last.current is not None:
        said.append(text.render(last.current))
        if last.good:
            said += ["", text.render_diff(*diff(last.good[0], last.current), last.good[0], last.current)]
    out.append((f"{view.name}/record.txt", ("\n".join(said) or "no record yet").encode() + b"\n"))
    return out


def _logs(view: DeploymentView) -> tuple[list[tuple[str, bytes]], list[str]]:
    out, problems = [], []
    for node in view.serve_nodes:
        try:
            out.append((f"{view.name}/logs/{node.name}.log", servelogs.tail(view.cfg, view.dep, node, LOG_LINES,
                                                                            LOG_BYTES)))
        except servelogs.Problem as e:
            problems.append(f"{view.name}: the serve's log on {node.name}: {e}")
    return out, problems


def collect(cfg: Config, config_path: str) -> tuple[list[tuple[str, bytes]], list[str]]:
    """The bundle's members (name, content), before redaction, and what could not be put in."""
    members: list[tuple[str, bytes]] = []
    problems: list[str] = []
    try:
        members.append(("config.json", _config(config_path)))
    except (OSError, ValueError) as e:
        problems.append(f"config: not read: {e}")
    try:
        status, transitions = _status(cfg.supervisor.state_dir)
        members += [(STATUS, status), ("transitions.txt", transitions)]
    except (OSError, ValueError, AttributeError) as e:
        problems.append(f"status: not read: {e}")
    for view in views(cfg).values():
        members += _records(view)
        logs, missing = _logs(view)
        members += logs
        problems += missing
    return members, problems


def write(cfg: Config, config_path: str, out: str, now: float) -> tuple[Path, list[str], int]:
    """Make the bundle (at ``out``, "-" for standard output, or in <state_dir>/reports/); its path, the names of
    its members and its size. ``out`` replaces only a regular file or nothing (OSError for anything else)."""
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%SZ")
    members, problems = collect(cfg, config_path)
    note = [f"spark-supervisor report, {stamp}: the config ({config_path}) with its secrets removed, the status "
            "and transitions, each deployment's record (record.txt: as `spark-supervisor record --diff` shows it), "
            "its history (records.jsonl), its facts at the last bad verdict (record-bad.json) and its serve logs' "
            f"tails (logs/, the last {LOG_LINES} lines). Every member redacted against the secrets known.",
            *(f"not included: {p}" for p in problems)]
    members.insert(0, ("README.txt", ("\n".join(note) + "\n").encode()))
    secrets = known_secrets(cfg, os.environ)
    clean = [(name, redaction.scrub(data.decode(errors="replace"), secrets).encode()[:MAX_MEMBER])
             for name, data in members]
    return deliver(cfg, out, f"spark-supervisor-report-{stamp}", clean, now)


def deliver(cfg: Config, out: str, name: str, members: list[tuple[str, bytes]], now: float
            ) -> tuple[Path, list[str], int]:
    """``members`` as the tar.gz ``name`` (its top folder too): to standard output ("-"), to ``out``, or under
    <state_dir>/reports/. Where it went, its member names and its size."""
    data = _tar(name, members, now)
    names = [n for n, _ in members]
    if out == "-":
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return Path("-"), names, len(data)
    if out:
        target = Path(out)
    else:
        target = Path(cfg.supervisor.state_dir) / REPORTS / f"{name}.tar.gz"
        statefile.make_dirs(target.parent, 0o700)
    _replace(target, data)
    return target, names, len(data)


def _tar(top: str, members: list[tuple[str, bytes]], now: float) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size, info.mtime, info.mode = len(data), int(now), 0o600
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _replace(target: Path, data: bytes) -> None:
    """``data`` written beside ``target`` under a fresh name (mode 0600: it names hosts and paths), then renamed
    over it: a reader never sees half of one. Only a regular file, or nothing, is replaced: as root, `--out
    /dev/null` would otherwise turn the host's /dev/null into a file, and a link would be replaced by one."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(st.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) \
                else "a special file"
            raise OSError(errno.EEXIST, f"{target} is {kind}, not a regular file: not replaced (use --out - for "
                          "standard output)")
    tmp = target.with_name(f".{target.name}.{tokens.token_hex(6)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
