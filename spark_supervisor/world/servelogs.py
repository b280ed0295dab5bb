"""`spark-supervisor logs`: the serve's log of each launch, kept on the serve nodes' own disks.

The wrapper that runs the serve (commands.SERVE_WRAPPER) writes one file per launch into
<log_host_dir>/<deployment>/<node>/ on the host (bind-mounted into the node's container), named
<UTC start>[_<n>]-<node>-<serve spec hash>.log, with `current` pointing to the newest and a part over
log_max_mib copied to <file>.1. The head's files are read here from the file system; a worker's over the
same SSH path the daemon uses (argument lists, timeouts). Naming and choosing are pure functions below.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
import threading
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

from ..base import files
from ..specs import script

if TYPE_CHECKING:  # imported where used at run time: `spark-supervisor logs` starts without them
    from ..adapters.shell import NodeShell
    from ..config import Config, Deployment, Node

# The wrapper's names: a start to the second (a second launch within it gets _1, _2, ...), the node (which
# may hold '-'), the spec hash (never '-' or '_').
NAME = re.compile(r"^(\d{8}T\d{6}Z)(?:_(\d+))?-(.+)-([0-9A-Za-z]+)\.log$")
CURRENT = "current"  # the link to the newest launch's file, beside them
ROTATED = ".1"  # the older part of a launch's log past log_max_mib

# Fixed scripts, their inputs as positional parameters (over SSH; FOLLOW locally too). The directory is the
# container's to write in, so nothing in it is trusted: the node's directory must not be a link, and only
# regular files that are not links are listed, read or followed (a file is checked, opened, then checked to
# be the one opened: a link or FIFO planted in between is not read). LIST: the node's launch files, exit 3
# when it has no directory yet. READ: the last $1 lines ("+1": all) of the files after it, each in order.
_SAFE = script.load("logs-safe.sh")
LIST = _SAFE + script.load("logs-list.sh")
READ = _SAFE + script.load("logs-read.sh")
# FOLLOW: the file `current` names (a plain name beside it), from its last $1 lines, then each newer launch
# whole, until the local side goes away: ssh gives a command no hangup without a terminal, and only GNU tail
# (8.28+) notices a closed pipe on its own, so a watcher waits for the end of its standard input (kept as fd 3:
# an asynchronous list's own stdin is /dev/null) and then stops the loop, which stops its tail.
FOLLOW = _SAFE + script.load("logs-follow.sh")
LINE_MAX = 1 << 20  # a longer line (a progress bar without newlines) is printed in pieces of this


class Problem(Exception):
    """Nothing to show, said plainly; ``code`` is the exit status (1 nothing there or not readable, 2 usage)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, order=True)
class Launch:
    """One launch's log file, ordered by its start (then its number within that second)."""

    started: str  # 20261203T081715Z
    seq: int
    node: str
    spec_hash: str
    name: str

    @property
    def started_at(self) -> str:
        """The start as the wrapper records it in `started` (and status shows): 2026-12-03T08:17:15Z."""
        s = self.started
        return f"{s[0:4]}-{s[4:6]}-{s[6:8]}T{s[9:11]}:{s[11:13]}:{s[13:15]}Z"


def log_name(started_at: str, node: str, spec_hash: str, seq: int = 0) -> str:
    """The file name the wrapper gives a launch that started at ``started_at`` (2026-12-03T08:17:15Z)."""
    stamp = started_at.replace("-", "").replace(":", "")
    return f"{stamp}{f'_{seq}' if seq else ''}-{node}-{spec_hash}.log"


def parse_name(name: str) -> Launch | None:
    m = NAME.match(name)
    if m is None:
        return None
    return Launch(m.group(1), int(m.group(2) or 0), m.group(3), m.group(4), name)


def launches(names: Iterable[str], node: str = "") -> list[Launch]:
    """The launches among a directory's names, oldest first (``node``: only that node's)."""
    found = (parse_name(n) for n in names)
    return sorted(x for x in found if x is not None and (not node or x.node == node))


def pick(found: list[Launch], previous: bool = False) -> Launch | None:
    """The current launch (the newest), or with ``previous`` the one before it; None when there is none."""
    want = 2 if previous else 1
    return found[-want] if len(found) >= want else None


def parts(launch: Launch, names: Iterable[str]) -> list[str]:
    """A launch's files in reading order: its rotated older part (when kept), then the file itself."""
    return ([launch.name + ROTATED] if launch.name + ROTATED in set(names) else []) + [launch.name]


def last_lines(chunks: Iterable[Iterable[bytes]], lines: int | None) -> Iterator[bytes]:
    """The lines of several files in order; with ``lines`` only the last that many (memory bounded)."""
    if lines is None:
        for chunk in chunks:
            yield from chunk
        return
    tail: deque[bytes] = deque(maxlen=lines)
    for chunk in chunks:
        tail.extend(chunk)
    yield from tail


def redact(line: bytes, secrets: list[str]) -> bytes:
    """One line of a serve's log fit to print (vLLM echoes its arguments and environment in some versions): the
    one redactor's (redaction.scrub: a URL's credentials, every secret the config and environment know of)."""
    from ..base import redaction
    return redaction.scrub(line.decode("utf-8", "surrogateescape"), secrets).encode("utf-8", "surrogateescape")


def _secrets(cfg: Config) -> list[str]:
    from ..config import known_secrets
    return known_secrets(cfg, os.environ)


# ----------------------------------------------------------------------------------------------------
def resolve(cfg: Config, deployment: str | None, node: str | None) -> tuple[Deployment, Node]:
    """The deployment (named, or the only one) and the node to read (named, or the serve's: rank 0)."""
    from ..specs.commands import serve_nodes
    names = [d.name for d in cfg.deployments]
    if deployment:
        dep = next((d for d in cfg.deployments if d.name == deployment), None)
        if dep is None:
            raise Problem(f"no deployment {deployment!r} in the config (deployments: {', '.join(names)})", 2)
    elif len(cfg.deployments) == 1:
        dep = cfg.deployments[0]
    else:
        raise Problem(f"the config has several deployments: name one ({', '.join(names)})", 2)
    serving = serve_nodes(cfg, dep)
    if not node:
        return dep, serving[0]
    found = next((n for n in serving if n.name == node), None)
    if found is None:
        where = ", ".join(n.name for n in serving)
        why = (f"not one of its nodes ({', '.join(n.name for n in cfg.members(dep))})"
               if node not in {n.name for n in cfg.members(dep)} else f"its serve runs on {where} only")
        raise Problem(f"{dep.name}: no serve runs on {node}: {why}", 2)
    return dep, found


def show(cfg: Config, dep: Deployment, node: Node, *, previous: bool, follow: bool, lines: int | None) -> int:
    from ..config.identity import node_container_name
    from ..specs.commands import serve_dir, serve_log_dir
    directory = serve_log_dir(dep, node)
    if not directory:
        raise Problem(f"{dep.name}: log_host_dir is \"\" ([deployments.serve]): the serve's log is kept in the "
                      f"container only; read it with `docker exec {node_container_name(dep, node)} cat "
                      f"{serve_dir(dep)}/log` on {node.name}")
    shell = _shell(cfg, node)
    names = _list(shell, directory, node.name)
    found = launches(names, node.name)
    n = "+1" if lines is None else str(lines)
    if follow and not previous:
        launch = pick(found)
        print(f"{node.name}: {directory}/{CURRENT}" + (f" ({launch.name})" if launch else " (no launch yet)")
              + ", following (Ctrl-C to stop)", file=sys.stderr)
        argv = ["sh", "-c", FOLLOW, "spark-logs", directory, n]
        return _stream(shell.argv(argv) if shell.target else argv, _secrets(cfg), timeout=None, hold_stdin=True)
    launch = pick(found, previous)
    if launch is None:
        raise Problem(f"{dep.name}: no {'previous launch' if previous else 'launch'} of the serve logged on "
                      f"{node.name} in {directory}" + (f" (only {found[0].name})" if found else ""))
    chosen = parts(launch, names)
    print(f"{node.name}: {directory}/{launch.name} (launch {launch.started_at}, serve spec {launch.spec_hash}"
          + (f", its older part {launch.name}{ROTATED} first" if len(chosen) > 1 else "") + ")", file=sys.stderr)
    if not shell.target:
        try:
            dirfd = _open_dir(directory)
            try:
                out, secrets = sys.stdout.buffer, _secrets(cfg)
                for line in last_lines((_lines(dirfd, f) for f in chosen), lines):
                    out.write(redact(line, secrets))
                out.flush()
            finally:
                os.close(dirfd)
        except files.Refused as e:
            raise Problem(f"{directory}/{e}: not read") from None
        except OSError as e:
            raise Problem(f"cannot read {directory}: {e.strerror or e}") from None
        return 0
    argv = shell.argv(["sh", "-c", READ, "spark-logs", directory, n, *chosen])
    return _stream(argv, _secrets(cfg), timeout=max(cfg.supervisor.io_timeout, 300), hold_stdin=False)


def tail(cfg: Config, dep: Deployment, node: Node, lines: int, limit: int = 1 << 18) -> bytes:
    """The last ``lines`` lines (at most ``limit`` bytes) of the current launch's log on ``node``, read as
    `logs -n` reads them (the API key redacted): for the support bundle. Problem when there is none to read."""
    from ..adapters import AdapterError
    from ..base import redaction
    from ..specs.commands import serve_log_dir
    directory = serve_log_dir(dep, node)
    if not directory:
        raise Problem(f"{dep.name}: log_host_dir is \"\": the serve's log is kept in the container only")
    shell = _shell(cfg, node)
    names = _list(shell, directory, node.name)
    launch = pick(launches(names, node.name))
    if launch is None:
        raise Problem(f"{dep.name}: no launch of the serve logged on {node.name} in {directory}")
    chosen = parts(launch, names)
    try:
        if shell.target:
            r = shell.run(["sh", "-c", READ, "spark-logs", directory, str(lines), *chosen])
            if r.rc != 0:
                raise Problem(f"{node.name}: cannot read {directory}: {(r.err.strip() or f'exit {r.rc}')[-200:]}")
            data = r.out.encode()
        else:
            dirfd = _open_dir(directory)
            try:  # each line kept to its last 4 KiB: the lines held stay bounded, whatever a line's length
                data = b"".join(last_lines(((ln[-4096:] for ln in _lines(dirfd, f)) for f in chosen), lines))
            finally:
                os.close(dirfd)
    except (AdapterError, OSError) as e:
        raise Problem(f"{node.name}: cannot read {directory}: {e}") from None
    # Redacted whole, then cut at a line's start: a cut never leaves part of a secret behind.
    data = redaction.scrub(data.decode(errors="replace"), _secrets(cfg)).encode()
    if len(data) > limit:
        data = data[-limit:]
        data = data[data.find(b"\n") + 1:]
    return data


def _open_dir(directory: str) -> int:
    """The node's log directory, itself not a link (its parent is the container's to write in)."""
    try:
        return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            what = "a symbolic link" if os.path.islink(directory) else "not a directory"
            raise Problem(f"{directory} is {what}: not read") from None
        raise


def _regular(dirfd: int, name: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=dirfd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _lines(dirfd: int, name: str) -> Iterator[bytes]:
    """A regular file's lines (no link followed), as far as it reached when it was opened."""
    fd = files.open_regular(name, follow_links=False, dir_fd=dirfd)
    with os.fdopen(fd, "rb") as f:
        left = os.fstat(fd).st_size
        while left > 0 and (line := f.readline(min(LINE_MAX, left))):
            left -= len(line)
            yield line


def _shell(cfg: Config, node: Node) -> NodeShell:
    from ..adapters.shell import NodeShell, SshKeys
    sup = cfg.supervisor
    return NodeShell(node.name, node.ssh, timeout=sup.io_timeout, connect_timeout=sup.ssh_connect_timeout,
                     keys=SshKeys.of(node))


def _list(shell: NodeShell, directory: str, node: str) -> list[str]:
    """The names in a node's log directory ([] when it has none yet)."""
    if not shell.target:
        try:
            dirfd = _open_dir(directory)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise Problem(f"cannot read {directory}: {e.strerror or e}") from None
        try:
            return [n for n in os.listdir(dirfd) if _regular(dirfd, n)]
        except OSError as e:
            raise Problem(f"cannot read {directory}: {e.strerror or e}") from None
        finally:
            os.close(dirfd)
    from ..adapters import AdapterError
    try:
        r = shell.run(["sh", "-c", LIST, "spark-logs", directory])
    except AdapterError as e:
        raise Problem(f"{node}: {e}") from None
    if r.rc == 3:
        return []
    if r.rc == 4:
        raise Problem(f"{node}: {r.err.strip()[-200:]}")
    if r.rc != 0:
        raise Problem(f"{node}: cannot list {directory}: {(r.err.strip() or f'exit {r.rc}')[-200:]}")
    return r.out.splitlines()


def _copy(src: IO[bytes], out: IO[bytes], secrets: list[str]) -> None:
    """``src`` to ``out`` as it comes, line by line (a secret or a URL is never split between two reads), until
    its end, redacted."""
    for line in src:
        out.write(redact(line, secrets))
        out.flush()


def _stream(argv: list[str], secrets: list[str], *, timeout: float | None, hold_stdin: bool) -> int:
    """Run ``argv`` and copy its output to ours as it comes (the API key redacted), until it ends, the
    deadline passes (killed), or Ctrl-C (130). ``hold_stdin``: keep its standard input open until then (a
    remote FOLLOW ends when it closes)."""
    import subprocess
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE if hold_stdin else subprocess.DEVNULL,
                                stdout=subprocess.PIPE)
    except OSError as e:
        raise Problem(f"cannot run {argv[0]}: {e.strerror or e}") from None
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        proc.kill()
    timer = threading.Timer(timeout, expire) if timeout else None
    if timer:
        timer.daemon = True
        timer.start()
    out: IO[bytes] = sys.stdout.buffer
    assert proc.stdout is not None
    try:
        _copy(proc.stdout, out, secrets)
        code = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
        return 130
    except BrokenPipeError:  # `logs | head`: the reader has all it wants
        proc.kill()
        return 0
    finally:
        if timer:
            timer.cancel()
        for pipe in (proc.stdin, proc.stdout):
            if pipe:
                pipe.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if expired.is_set():
        raise Problem(f"{argv[0]} did not finish within {timeout or 0:.0f}s")
    if code == 255 and argv[0] == "ssh":
        raise Problem("ssh failed (exit 255): the node does not answer over SSH")
    return 0 if code == 0 else 1
