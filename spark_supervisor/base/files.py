"""Reading a file from outside the daemon without letting it hurt the daemon.

Every file the daemon reads (its config, key files, state files, serve logs) is read through here: it must
be a regular file (a FIFO would block the reader for ever, a device such as /dev/zero never ends, a link to
/dev/stdin reads standard input), it is opened without blocking, without following a symbolic link where
none is expected, and at most ``limit`` bytes are taken: a bigger file is refused, never read in part.
"""

from __future__ import annotations

import errno
import os
import stat


class Refused(OSError):
    """The file cannot be read as asked; ``why`` says why in words for an operator."""

    def __init__(self, path: str, why: str):
        super().__init__(errno.EINVAL, why, path)
        self.path = path
        self.why = why

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str | os.PathLike[str], *, follow_links: bool = True, dir_fd: int | None = None) -> int:
    """A read-only descriptor on a regular file; Refused for anything else (a FIFO does not block: it is
    opened non-blocking and refused by its type). ``follow_links=False`` refuses a symbolic link as the
    last component. Other OSErrors (missing, no permission) are raised as they are."""
    p = os.fspath(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    if not follow_links:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(p, flags, dir_fd=dir_fd)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_links:
            raise Refused(p, "is a symbolic link: give the file itself") from None
        if e.errno == errno.ENXIO:  # a socket, or a FIFO's write side
            raise Refused(p, "is not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(p, f"is {_kind(st.st_mode)}, not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: str | os.PathLike[str], limit: int, *, follow_links: bool = True,
               dir_fd: int | None = None) -> bytes:
    """The whole of a regular file of at most ``limit`` bytes; Refused when it is not one or is bigger."""
    fd = open_regular(path, follow_links=follow_links, dir_fd=dir_fd)
    try:
        chunks, got = [], 0
        while got <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    finally:
        os.close(fd)
    if got > limit:
        raise Refused(os.fspath(path), f"is larger than {limit} bytes: not the file you meant?")
    return b"".join(chunks)


def read_text(path: str | os.PathLike[str], limit: int, *, follow_links: bool = True) -> str:
    """``read_bytes`` decoded as UTF-8 (UnicodeDecodeError, a ValueError, when it is not)."""
    return read_bytes(path, limit, follow_links=follow_links).decode("utf-8")


def read_tail(path: str | os.PathLike[str], limit: int, *, follow_links: bool = False,
              dir_fd: int | None = None) -> bytes:
    """The last ``limit`` bytes of a regular file (a log that may be any size)."""
    fd = open_regular(path, follow_links=follow_links, dir_fd=dir_fd)
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - limit), os.SEEK_SET)
        chunks, got = [], 0
        while got < limit:
            chunk = os.read(fd, min(1 << 20, limit - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


MAX_FDS_SCANNED = 200_000  # a bound on the walk of /proc: a host with more open files is not searched further


def writers(path: str | os.PathLike[str], proc: str = "/proc") -> list[int]:
    """The processes that hold ``path`` open for writing (an editor or `cat >` still writing it), from /proc;
    only those this process may look at (the daemon runs as root: all). Bounded; whatever cannot be read is
    skipped."""
    try:
        target = os.path.realpath(path)
    except OSError:
        return []
    found: list[int] = []
    seen = 0
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        try:
            fds = os.listdir(f"{proc}/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            seen += 1
            if seen > MAX_FDS_SCANNED:
                return found
            try:
                if os.readlink(f"{proc}/{pid}/fd/{fd}") != target:
                    continue
                with open(f"{proc}/{pid}/fdinfo/{fd}", "rb") as f:
                    info = f.read(4096)
            except OSError:
                continue
            flags = next((int(line.split()[1], 8) for line in info.splitlines() if line.startswith(b"flags:")), 0)
            if flags & os.O_ACCMODE in (os.O_WRONLY, os.O_RDWR):
                found.append(int(pid))
                break
    return found
