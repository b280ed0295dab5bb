"""`copy-model`: the deployment's model from the head to a member, over the fabric, verified (the operator's
command; the daemon never runs it). Where the model is on each node is the model check's answer (the probe
in the deployment's image, as vLLM will look); the files are listed on the hosts (specs.modelcopy.LIST),
planned and verified in judge.modelcopy, sent as one tar stream (links followed) relayed through this process
(its progress and its deadlines are ours), into a partial directory beside the destination, and renamed into
place only once every file sent has its size and, where the hub names it, its sha256. Refused while the
target runs a deployment: on unified memory a copy's page cache is taken from the GPU's memory."""

from __future__ import annotations

import contextlib
import os
import posixpath
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..adapters import AdapterError
from ..adapters.shell import NodeShell, Result, SshKeys, run_local, ssh_g
from ..config import Config, Deployment, Node
from ..config.identity import is_helper, is_stale, owned_by_any, prefetch_name
from ..config.view import views
from ..judge import modelcopy
from ..judge.modelcheck import differences, host_path, problem, size_text
from ..model import CheckModel, ModelReport
from ..specs import modelcopy as spec
from .act import ActionFailed, Actor
from .observe import World

CHUNK = 1 << 20
Say = Callable[[str], None]


class CopyProblem(Exception):
    """Why the copy did not happen or did not complete (code: the command's exit status)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Options:
    dry_run: bool = False
    via: str = "fabric"  # or "ssh": the node's ssh target as configured
    sha256: bool = True
    resend: bool = False
    min_rate: float = modelcopy.MIN_RATE
    stall_s: float = 120.0


@dataclass(frozen=True)
class Where:
    """What is copied from where to where, on the hosts."""

    source: str  # on the head
    dest: str  # on the target
    ref: str = ""  # the hub cache's refs file pointed at ``commit`` ("": none to write)
    commit: str = ""


def deployment(cfg: Config, name: str | None) -> Deployment:
    names = [d.name for d in cfg.deployments]
    if name:
        found = next((d for d in cfg.deployments if d.name == name), None)
        if found is None:
            raise CopyProblem(f"no deployment {name!r} in the config (deployments: {', '.join(names)})", 2)
        return found
    if len(cfg.deployments) == 1:
        return cfg.deployments[0]
    raise CopyProblem(f"the config has several deployments: name one ({', '.join(names)})", 2)


def serving(cfg: Config, dep: Deployment, world: World, node: Node) -> str:
    """Why the target may not be copied to now ("": it may): a deployment's container (or a stale one) runs
    there, or the daemon runs this deployment in a phase that may start a load while the copy runs."""
    try:
        found = world.nodes[node.name].docker.containers()
    except AdapterError as e:
        return f"cannot tell whether {node.name} serves: its Docker engine: {e}"
    # A prefetch (a helper) of this deployment writes into the same model directory: busy too.
    busy = sorted(c.name for c in found if c.running and (c.name == prefetch_name(dep, node) or (
        not is_helper(c) and (owned_by_any(c, cfg) or is_stale(c, cfg)))))
    if busy:
        return (f"{node.name} runs {', '.join(busy)}: a copy there fills the page cache, which on unified memory is "
                "the GPU's memory. Stop it first (`systemctl stop spark-supervisor` and `spark-supervisor teardown`, "
                "or copy while the deployment is FAILED)")
    from ..state import control, statefile
    state_dir = cfg.supervisor.state_dir
    try:
        running = control.daemon_holds_lock(state_dir)
    except OSError as e:  # unknown is not "not running": the daemon may start a load there while the copy runs
        return (f"cannot tell whether the daemon runs ({state_dir}: {e.strerror or e}): run copy-model as the "
                "daemon's user (root)")
    if not running:
        return ""
    try:
        doc = statefile.read(state_dir)
        phases = {d.get("deployment", {}).get("name"): d.get("phase") for d in doc.get("deployments", [])}
    except (OSError, ValueError, AttributeError):
        phases = {}
    phase = phases.get(dep.name)
    if phase in ("FAILED", "PAUSED"):
        return ""
    return (f"the daemon runs {dep.name} ({phase or 'phase unknown'}): it may start a load on {node.name} while the "
            "copy runs. Copy while it is FAILED or PAUSED with nothing running there, or with the daemon stopped")


def _checked(actor: Actor, node: str) -> ModelReport:
    try:
        r = actor.run(CheckModel(node))
    except ActionFailed as e:
        raise CopyProblem(f"{node}: the model check could not run: {e.reason}") from None
    assert isinstance(r, ModelReport)
    if r.unchecked:
        raise CopyProblem(f"{node}: the model check could not look: {r.unchecked}")
    return r


def where(dep: Deployment, head: ModelReport, target: ModelReport) -> Where:
    """The head's directory and the target's, on the hosts (through the deployment's volumes). A hub model
    goes to the same snapshot (the head's commit) in the target's own cache, and the target's ref (the
    configured revision, else main) is pointed at it: the revision pinned to the head's."""
    if head.missing or not head.found:
        raise CopyProblem(f"the head {head.node} has no whole copy to send: {head.summary()}")
    source = host_path(dep, head.path)
    if not source:
        raise CopyProblem(f"{head.path} is on no volume of {dep.name} on {head.node} (inside the image): nothing to copy")
    if head.source != "hub":
        dest = host_path(dep, head.path)
        return Where(source, dest)
    cache = host_path(dep, target.cache) if target.cache else ""
    if not cache:
        raise CopyProblem(f"{target.node}: its hub cache {target.cache or '?'} is on no volume of {dep.name}: mount it "
                          "in deployments.ray.volumes")
    repo = posixpath.basename(posixpath.dirname(posixpath.dirname(head.path)))  # models--Org--Name
    commit = head.revision
    ref = "" if commit in (dep.serve.revision, target.revision) else posixpath.join(cache, repo, "refs", dep.serve.revision or "main")
    return Where(source, posixpath.join(cache, repo, "snapshots", commit), ref, commit)


def _shell(cfg: Config, node: Node, via: str) -> Callable[[list[str]], list[str]]:
    """How to run an argument list on a node: locally (the head), over its ssh target, or over its fabric."""
    sup = cfg.supervisor
    shell = NodeShell(node.name, node.ssh, timeout=sup.io_timeout, connect_timeout=sup.ssh_connect_timeout,
                      keys=SshKeys.of(node))
    if not node.ssh or via == "ssh":
        return shell.argv
    alias = spec.key_alias(ssh_g(node.ssh, sup.io_timeout), node.ssh)
    return lambda argv: spec.over_fabric(shell.argv(argv), node.fabric_ip, alias)


def _real(on: Callable[[list[str]], list[str]], path: str, timeout: float, node: str) -> str:
    """``path`` with its links resolved on the node (`realpath -m`: what does not exist yet stays as given): the
    partial directory then lands on the filesystem the model lives on, and the final renames stay renames (a
    /models/X linked to another disk would otherwise make them a slow copy)."""
    r = _run(on(["realpath", "-m", "--", path]), timeout, f"{node}: realpath {path}")
    got = r.out.strip()
    return got if r.rc == 0 and got.startswith("/") and "\n" not in got else path


def _run(argv: list[str], timeout: float, what: str) -> Result:
    """adapters.shell.run_local (its session killed past the timeout, its output decoded whatever its bytes),
    each failure to run a CopyProblem; ssh's own failure (exit 255) named."""
    try:
        r = run_local(argv, timeout)
    except AdapterError as e:
        raise CopyProblem(f"{what}: {e}") from None
    if r.rc == 255 and argv[0] == "ssh":
        fabric = any(a.lower().startswith("hostname=") for a in argv)  # spec.over_fabric
        raise CopyProblem(f"{what}: ssh: {r.err.strip()[-300:] or 'failed'}"
                          + (" (over the fabric IP: does the node's sshd listen there? --via ssh takes its ssh target)"
                             if fabric else ""))
    return r


def listing(on: Callable[[list[str]], list[str]], directory: str, timeout: float, what: str) -> dict[str, modelcopy.Entry]:
    r = _run(on(spec.list_argv(directory)), timeout, what)
    if r.rc == 3:
        return {}
    if r.rc != 0:
        raise CopyProblem(f"{what}: cannot list {directory}: {(r.err.strip() or f'exit {r.rc}')[-300:]}")
    try:
        return modelcopy.parse_listing(r.out)
    except modelcopy.ListingError as e:
        raise CopyProblem(f"{what}: {e}") from None


def stream(source: list[str], sink: list[str], *, total: int, deadline: float, stall_s: float,
           progress: Callable[[int, float], None]) -> tuple[int, float]:
    """``source``'s standard output into ``sink``'s standard input, counted; both killed (their sessions) past
    ``deadline`` seconds, or when no byte has moved for ``stall_s``. (bytes, seconds)."""
    with tempfile.TemporaryFile() as src_err, tempfile.TemporaryFile() as dst_err:
        src = subprocess.Popen(source, stdout=subprocess.PIPE, stderr=src_err, stdin=subprocess.DEVNULL,
                               start_new_session=True)
        dst = subprocess.Popen(sink, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=dst_err,
                               start_new_session=True)
        start = time.monotonic()
        moved, last, why = 0, start, ""
        done = threading.Event()

        def kill(reason: str) -> None:
            nonlocal why
            why = why or reason
            for p in (src, dst):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)

        def watch() -> None:
            while not done.wait(0.5):
                now = time.monotonic()
                if now - start > deadline:
                    return kill(f"past its deadline of {modelcopy.duration_text(deadline)}")
                if now - last > stall_s:
                    return kill(f"no byte moved for {stall_s:g}s")
        threading.Thread(target=watch, daemon=True, name="copy-watch").start()
        assert src.stdout is not None and dst.stdin is not None
        try:
            while chunk := os.read(src.stdout.fileno(), CHUNK):
                dst.stdin.write(chunk)
                moved += len(chunk)
                last = time.monotonic()
                progress(moved, last - start)
            dst.stdin.close()
        except (BrokenPipeError, OSError):
            pass
        except KeyboardInterrupt:
            kill("interrupted")
        try:
            src_rc, dst_rc = src.wait(timeout=max(1.0, deadline - (time.monotonic() - start))), dst.wait(timeout=120)
        except subprocess.TimeoutExpired:
            kill("its end did not come")
            src_rc, dst_rc = src.wait(), dst.wait()
        done.set()
        seconds = time.monotonic() - start
        for pipe in (src.stdout, dst.stdin):
            with contextlib.suppress(OSError):
                pipe.close()
        if why or src_rc or dst_rc:
            src_err.seek(0)
            dst_err.seek(0)
            tails = [f"{n} exit {rc}: {f.read().decode(errors='backslashreplace').strip()[-300:]}"
                     for n, rc, f in (("head's tar", src_rc, src_err), ("target's tar", dst_rc, dst_err)) if rc]
            raise CopyProblem(f"the copy stopped after {moved:,} of {total:,} bytes "
                              f"({why or 'a side failed'}){': ' + '; '.join(tails) if tails else ''}")
        return moved, seconds


class Progress:
    """The copy's progress on standard error: a line rewritten on a terminal, else one line every 10 s."""

    def __init__(self, total: int, out: Say) -> None:
        self.total, self.out, self.tty = total, out, sys.stderr.isatty()
        self.shown = -1e9

    def __call__(self, moved: int, seconds: float) -> None:
        if seconds - self.shown < (0.5 if self.tty else 10.0):
            return
        self.shown = seconds
        moved = min(moved, self.total)  # the stream's tar headers and padding are not the files' bytes
        rate = moved / seconds if seconds > 0 else 0.0
        eta = f", {modelcopy.duration_text((self.total - moved) / rate)} left" if rate > 0 and moved < self.total else ""
        line = (f"{size_text(moved)} of {size_text(self.total)} "
                f"({100 * moved / max(1, self.total):.0f}%), {modelcopy.rate_text(moved, seconds)}{eta}")
        if self.tty:
            print(f"\r{line}\033[K", end="", file=sys.stderr, flush=True)
        else:
            self.out(line)


def copy(cfg: Config, dep: Deployment, to: str, opts: Options, say: Say) -> dict[str, object]:
    """The copy (or, dry, its plan): what was sent, how long it took and the model check after it."""
    import structlog
    members = cfg.members(dep)
    names = [n.name for n in members]
    target = next((n for n in members[1:] if n.name == to), None)
    if target is None:
        why = "the head: the copy goes from it" if to == names[0] else f"not a member of {dep.name} ({', '.join(names)})"
        raise CopyProblem(f"--to {to}: {why}", 2)
    if not target.ssh:
        raise CopyProblem(f"{to} has no ssh target ([[nodes]] ssh): the copy reaches it over SSH", 2)
    head = members[0]
    world = World(views(cfg)[dep.name])
    try:
        refused = serving(cfg, dep, world, target)
        if refused and not opts.dry_run:
            raise CopyProblem(f"refused: {refused}")
        # dry: no pull, no state written; quiet: the checks' own log lines are the daemon's, not this command's
        actor = Actor(world, structlog.wrap_logger(structlog.ReturnLogger()), dry=True)
        head_r, target_r = _checked(actor, head.name), _checked(actor, target.name)
        w = where(dep, head_r, target_r)
        timeout = cfg.supervisor.io_timeout + 30
        on_head, on_target = _shell(cfg, head, opts.via), _shell(cfg, target, opts.via)
        src = listing(on_head, w.source, timeout, f"{head.name}:{w.source}")
        dst = listing(on_target, w.dest, timeout, f"{to}:{w.dest}")
        p = modelcopy.plan(src, dst, resend=opts.resend)
        if p.problems:
            raise CopyProblem(f"the head {head.name} has no whole copy in {w.source}: {', '.join(p.problems[:5])}")
        deadline = modelcopy.deadline_s(p.nbytes, opts.min_rate)
        route = f"over {'the fabric (' + target.fabric_ip + ')' if opts.via == 'fabric' else 'ssh ' + target.ssh}"
        say(f"{dep.serve.model}{' @ ' + w.commit if w.commit else ''}: {head.name}:{w.source} -> {to}:{w.dest} {route}")
        for f in p.send:
            say(f"  send {f} ({p.why[f]})")
        say(f"  {len(p.send)} files to send, {size_text(p.nbytes)}; {len(p.same)} already the head's (by size"
            f"{' and blob' if any(src[f].sha256 for f in p.same) else ''}); {len(p.hashed)} to check by sha256"
            + (f"; {len(p.extra)} only on {to}, left there" if p.extra else ""))
        if w.ref:
            say(f"  {to}:{w.ref} -> {w.commit}")
        result: dict[str, object] = {"node": to, "source": w.source, "dest": w.dest, "revision": w.commit,
                                     "send": list(p.send), "bytes": p.nbytes, "deadline_s": round(deadline)}
        if refused:
            say(f"  would be refused now: {refused}")
        if opts.dry_run:
            say(f"  dry run: nothing sent (its deadline would be {modelcopy.duration_text(deadline)}: "
                f"{modelcopy.FIXED_S:g}s + the bytes at {opts.min_rate / 1e6:g} MB/s)")
            return {**result, "dry_run": True}
        partial = spec.partial_dir(_real(on_target, w.dest, timeout, to))
        moved, seconds = 0, 0.0
        if p.send:
            say(f"  deadline {modelcopy.duration_text(deadline)} ({modelcopy.FIXED_S:g}s + the bytes at "
                f"{opts.min_rate / 1e6:g} MB/s), stall limit {opts.stall_s:g}s")
            show = Progress(p.nbytes, say)
            moved, seconds = stream(on_head(spec.source_argv(w.source, list(p.send))), on_target(spec.sink_argv(partial)),
                                    total=p.nbytes, deadline=deadline, stall_s=opts.stall_s, progress=show)
            if show.tty:
                print(file=sys.stderr)
            got = listing(on_target, partial, timeout, f"{to}:{partial}")
            hashes = None
            if opts.sha256 and p.hashed:
                hashed_bytes = sum(src[f].size for f in p.hashed)
                r = _run(on_target(spec.hash_argv(partial, list(p.hashed))), modelcopy.hash_deadline_s(hashed_bytes),
                         f"{to}: sha256")
                hashes = modelcopy.parse_hashes(r.out)
            bad = modelcopy.verify(p, src, got, hashes)
            if bad:
                raise CopyProblem(f"what arrived on {to} is not the head's (left in {partial}, not renamed into "
                                  f"place): {'; '.join(bad[:5])}")
        if p.send or w.ref:
            r = _run(on_target(spec.finish_argv(partial, w.dest, w.ref, w.commit, list(p.send))), timeout + len(p.send),
                     f"{to}: renaming into place")
            if r.rc != 0:
                raise CopyProblem(f"{to}: renaming into place failed: {r.err.strip()[-300:]}")
        hashed = list(p.hashed) if opts.sha256 else []
        checked = {"size": list(p.send), "sha256": hashed}
        say(f"{to}: {len(p.send)} files, {size_text(p.nbytes)} in {modelcopy.duration_text(seconds)} "
            f"({modelcopy.rate_text(p.nbytes, seconds)}); each one's size checked, and the sha256 of {len(hashed)}")
        structlog.get_logger().info("model.copied", deployment=dep.name, node=to, source=w.source, dest=w.dest,
                                    revision=w.commit or None, files=len(p.send), bytes=p.nbytes, seconds=round(seconds, 1),
                                    sha256_checked=len(hashed))
        after = {head.name: _checked(actor, head.name), to: _checked(actor, to)}
        found = problem(cfg, dep, after)
        say(f"model check: {found[0]}: {found[1]}" if found else
            f"model check: {to} has the head's model ({after[to].summary()})")
        diffs = differences(after[head.name], after[to])
        return {**result, "stream_bytes": moved, "seconds": round(seconds, 1), "checked": checked,
                "model_check": f"{found[0]}: {found[1]}" if found else "complete", "differences": diffs}
    finally:
        world.close()
