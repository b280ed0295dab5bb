"""One node's Docker engine (local socket or ssh://), through docker-py, every call bounded in time."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import docker
import docker.errors
import paramiko
import tenacity
from docker.models.containers import Container as DockerContainer
from docker.types import DeviceRequest

from ..config import identity
from ..model import Container, ContainerSpec
from . import AdapterError, ImageMissingError, NotFoundError, TransientError, Unreachable, dockerssh, within
from .shell import NO_KEYS, SshKeys

# docker-py reaches an ssh:// engine through paramiko, whose transport thread wakes every 0.1 s (its
# `_active_check_timeout`) only to see whether it was closed: ten wakes a second per SSH engine for the daemon's
# whole life, measured at a quarter of its idle CPU. Once in 5 s is enough: data wakes it at once, a close
# (packetizer.close) does not wait for the wake, and a dead peer is caught by every call's own deadline. Each
# wake of an idle daemon's thread runs cold (about 0.1 ms of CPU, measured), and there is a transport for each
# SSH engine of each deployment and one for each engine's event stream.
paramiko.Transport._active_check_timeout = 5.0

T = TypeVar("T")


def _reason(e: BaseException) -> AdapterError:
    if isinstance(e, AdapterError):
        return e
    if (named := dockerssh.host_key_error(e)) is not None:
        return named
    if isinstance(e, docker.errors.ImageNotFound):
        return ImageMissingError("ImageMissing", str(getattr(e, "explanation", "") or e))
    if isinstance(e, docker.errors.NotFound):
        return NotFoundError("NotFound", str(getattr(e, "explanation", "") or e))
    if isinstance(e, docker.errors.APIError):
        return AdapterError("DockerError", str(getattr(e, "explanation", "") or e))
    return Unreachable("DockerUnreachable", f"{type(e).__name__}: {e}"[:300])


def _client(url: str, timeout: float, keys: SshKeys = NO_KEYS) -> docker.DockerClient:
    """A client of the engine at ``url`` ("local": this host's socket) that reads no proxy settings: its
    requests.Session would read the environment's proxies (and ~/.netrc) on every request, a quarter of a
    listing's CPU, for settings no Docker socket or SSH channel takes. An ssh:// engine with the node's own
    known_hosts or key goes through adapters.dockerssh."""
    try:
        if url == "local":
            c = docker.DockerClient(base_url="unix:///var/run/docker.sock", timeout=int(timeout))
        elif url.startswith("ssh://") and keys != NO_KEYS:
            c = dockerssh.client(url, timeout, keys)
        else:
            c = docker.DockerClient(base_url=url, timeout=int(timeout), max_pool_size=4)
    except Exception as e:  # docker-py raises DockerException, paramiko's, OSError...
        raise _reason(e) from None
    c.api.trust_env = False
    return c


# The events that change what a listing holds (a container's presence, name, state or labels); an exec's
# or a health check's events change none of it and would only make a steady sweep list again.
CHANGES = ["create", "start", "restart", "die", "kill", "stop", "oom", "pause", "unpause", "destroy", "rename",
           "update"]
# A process run in a container ended (`docker exec`'s; a serve's wrapper is one): it changes no listing, but in a
# container of ours it is a cue to look now (_Listings.listen), so a serve that dies is seen at once, not at the
# next quick check. A cue is never evidence: what is looked at decides.
EXEC_ENDED = "exec_die"


class _Follower:
    """One engine's container events, followed in a thread of its own over a client of its own while some
    daemon watches the engine (``users``). ``gen`` moves on every event and whenever the stream opens or
    ends: a listing taken at one generation is still the engine's while the generation has not moved and the
    stream is open. An ended or failing stream is not trusted (every listing is fresh until it is back, its
    reconnects backed off); a silent one no longer than _Listings.TRUST_S.

    Heavy but earned: a steady sweep keeps its listing while nothing changed (the idle goal), and a serve's end
    is a cue at once (a dead serve's repair within 1 s; docs/benchmarks.md). Measure before you simplify it."""

    def __init__(self, node: str, url: str, timeout: float, changed: threading.Lock,
                 exec_ended: Callable[[dict[str, Any]], None], keys: SshKeys = NO_KEYS):
        self.node, self.url, self.timeout, self.keys = node, url, timeout, keys
        self.users, self.gen, self.live = 1, 0, False
        self._changed = changed  # the listings' lock: a generation and a listing move together
        self._exec_ended = exec_ended
        self._stop = threading.Event()
        self._client: docker.DockerClient | None = None
        self._stream: Any = None
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"events {node}")
        self.thread.start()

    def _bump(self, live: bool) -> None:
        with self._changed:
            self.gen += 1
            self.live = live and not self._stop.is_set()

    LIVED_S = 10.0  # a stream that lived this long and ended is followed again at once, its backoff afresh

    def _run(self) -> None:
        retrying = tenacity.Retrying(retry=tenacity.retry_if_exception_type(Exception),
                                     wait=tenacity.wait_exponential(multiplier=0.5, max=30),
                                     stop=tenacity.stop_when_event_set(self._stop), sleep=self._pause)
        while not self._stop.is_set():
            try:
                retrying(self._follow)
            except tenacity.RetryError:  # stopped
                return

    def _pause(self, seconds: float) -> None:
        self._stop.wait(seconds)  # a stop ends the wait between reconnects

    def _follow(self) -> None:
        self._client = client = _client(self.url, self.timeout, self.keys)
        try:
            if self._stop.is_set():
                return
            self._stream = stream = client.api.events(decode=True, filters={"type": "container",
                                                                            "event": [*CHANGES, EXEC_ENDED]})
            if self._stop.is_set():  # stopped while it opened: stop() may have missed this stream
                stream.close()
                return
            self._bump(live=True)  # the response began: from here on every change comes through it
            opened = time.monotonic()
            ended: Exception = Unreachable("DockerEventsEnded", f"the event stream of {self.node} ended")
            try:
                for event in stream:
                    if _is_exec_end(event):
                        self._exec_ended(event)
                    else:
                        self._bump(live=True)
            except Exception as e:  # a reset channel, an engine gone: the same end
                ended = e
            if time.monotonic() - opened < self.LIVED_S:  # one that ends as it opens is backed off
                raise ended
        finally:
            self._bump(live=False)
            client.close()

    def stop(self) -> None:
        self._stop.set()
        self._bump(live=False)
        for close in (getattr(self._stream, "close", None), getattr(self._client, "close", None)):
            try:  # the stream ends a local socket's read; over SSH it cannot, and the client's close ends it
                if close is not None:
                    close()
            except Exception:
                pass


class _Listings:
    """Each engine's container list, shared by everything in this process that asks it: for a moment (TTL_S:
    the deployments placed on one node sweep it in the same pass, and one listing serves them all), or, for a
    steady sweep (``trusted``), for as long as the engine's followed event stream says nothing changed, at most
    TRUST_S. Dropped at once when this process changes that engine's containers (so a plan never reads its own
    past) or an event comes. The same streams tell of execs ending in our containers: cues to ``listen``ers."""

    TTL_S = 0.5
    TRUST_S = 30.0  # a silent stream is believed this long: a listing at least this often, whatever it says

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: dict[str, tuple[float, list[Container], int]] = {}
        self.followers: dict[str, _Follower] = {}
        self.listeners: list[Callable[[], None]] = []
        self.awaited: dict[str, bool] = {}  # the execs this process waits on (newest last, at most AWAITED)

    def listen(self, cue: Callable[[], None]) -> Callable[[], None]:
        """Call ``cue`` (from an event thread: it must only record and wake) whenever a process run in one of our
        containers on a followed engine ends. Returns the call that stops it."""
        with self.lock:
            self.listeners.append(cue)

        def stop() -> None:
            with self.lock:
                if cue in self.listeners:
                    self.listeners.remove(cue)
        return stop

    AWAITED = 256

    def await_exec(self, exec_id: str) -> None:
        """An exec this process waits on and reads the end of itself: its end is no cue."""
        with self.lock:
            self.awaited[exec_id] = True
            while len(self.awaited) > self.AWAITED:
                del self.awaited[next(iter(self.awaited))]

    def _exec_ended(self, event: dict[str, Any]) -> None:
        attributes = (event.get("Actor") or {}).get("Attributes") or {}
        with self.lock:
            if identity.owner_of(attributes) is None or self.awaited.pop(attributes.get("execID", ""), False):
                return  # not in a container of ours, or one this process waited on
            listeners = list(self.listeners)
        for cue in listeners:
            cue()

    def generation(self, url: str) -> int:
        """Read before a listing is asked: a change told while the answer travels makes it stale at once."""
        with self.lock:
            f = self.followers.get(url)
            return f.gen if f is not None and f.live else -1

    def get(self, url: str, trusted: bool = False) -> list[Container] | None:
        now = time.monotonic()
        with self.lock:
            at, found, gen = self.seen.get(url, (-1e9, [], -1))
            f = self.followers.get(url)
            if now - at < self.TTL_S:
                return found
            if trusted and f is not None and f.live and gen == f.gen and now - at < self.TRUST_S:
                return found
        return None

    def put(self, url: str, found: list[Container], at: float, gen: int) -> None:
        with self.lock:
            self.seen[url] = (at, found, gen)

    def drop(self, url: str) -> None:
        with self.lock:
            self.seen.pop(url, None)

    def follow(self, node: str, url: str, timeout: float, keys: SshKeys = NO_KEYS) -> None:
        with self.lock:
            f = self.followers.get(url)
            if f is not None:
                f.users += 1
            else:
                self.followers[url] = _Follower(node, url, timeout, self.lock, self._exec_ended, keys)

    def unfollow(self, url: str) -> None:
        with self.lock:
            f = self.followers.get(url)
            if f is None:
                return
            f.users -= 1
            if f.users > 0:
                return
            del self.followers[url]
        f.stop()


def _is_exec_end(event: object) -> bool:
    """exec_die is its action whole (exec_create's and exec_start's carry the command after a colon)."""
    return isinstance(event, dict) and event.get("Action") == EXEC_ENDED


LISTINGS = _Listings()


_IMAGE_ID = re.compile(r"(?:sha256:)?[0-9a-f]{12,64}")


def is_image_id(image: str) -> bool:
    """An image by its ID (``sha256:<hex>``, or the hex alone, 12 digits or more), not by a name."""
    return _IMAGE_ID.fullmatch(image) is not None


class DockerEngine:
    def __init__(self, node: str, url: str, *, timeout: float, follow: bool = False, keys: SshKeys = NO_KEYS):
        """follow: follow the engine's container events from its first steady sweep until close(), so that a
        steady sweep need not list its containers (the daemon's; a one-shot command lists every time). Not
        before: a start has no steady sweep, and its stream's connection (an SSH handshake) would only compete
        with the start."""
        self.node, self.url, self.timeout, self.keys = node, url, timeout, keys  # keys: an ssh:// engine's
        self._events: bool | None = False if follow else None  # None: never followed; False: not yet; True: followed
        self._client: docker.DockerClient | None = None
        self._lock = threading.Lock()

    def client(self) -> docker.DockerClient:
        with self._lock:
            if self._client is None:
                self._client = _client(self.url, self.timeout, self.keys)
            return self._client

    @property
    def connected(self) -> bool:
        return self._client is not None

    def close(self) -> None:
        """Done with the engine: its connection dropped, its events no longer followed for it."""
        self.reset()
        with self._lock:
            followed, self._events = self._events, None
        if followed:  # outside the lock: stopping a stream over SSH may take a moment
            LISTINGS.unfollow(self.url)

    def reset(self) -> None:
        """Drop the connection after a failure; the next call reconnects."""
        with self._lock:
            c, self._client = self._client, None
        if c is not None:
            try:
                c.close()
            except Exception:
                pass

    def _call(self, fn: Callable[[], T], *, timeout: float | None = None, what: str = "docker",
              heartbeat: Callable[[], None] | None = None) -> T:
        """Every engine call under a hard deadline (docker-py's own timeout bounds each socket read, not
        the call): a hung engine becomes DockerTimeout, a reason, instead of a hung loop."""
        try:
            return within(fn, timeout or self.timeout + 5, f"{what} on {self.node}", heartbeat=heartbeat,
                          reason="DockerTimeout")
        except (docker.errors.NotFound, docker.errors.APIError) as e:
            raise _reason(e) from None
        except TransientError:
            self.reset()
            raise
        except AdapterError:
            raise
        except Exception as e:
            self.reset()
            raise _reason(e) from None

    def version(self) -> str:
        return str(self._call(lambda: self.client().version().get("Version", "")))

    def root_dir(self) -> str:
        """Where the engine keeps its images (docker info's DockerRootDir): what a pull fills."""
        return str(self._call(lambda: self.client().info().get("DockerRootDir", "")))

    def containers(self, trusted: bool = False) -> list[Container]:
        """The engine's containers. trusted: a steady sweep's, which may take a listing kept while the
        engine's followed events say nothing changed (_Listings); the first starts following them."""
        if trusted and self._events is False:
            with self._lock:  # observations of one engine may overlap: it is followed once
                if self._events is False:
                    self._events = True
                    LISTINGS.follow(self.node, self.url, self.timeout, self.keys)
        kept = LISTINGS.get(self.url, trusted)
        if kept is not None:
            return kept
        # Both taken before asking: a change made while the answer travels is not hidden.
        at, gen = time.monotonic(), LISTINGS.generation(self.url)
        raw = self._call(lambda: self.client().api.containers(all=True))
        found = [Container(id=c["Id"][:12], name=(c.get("Names") or ["/?"])[0].lstrip("/"),
                           image=c.get("Image", ""), state=c.get("State", ""), labels=c.get("Labels") or {},
                           image_id=c.get("ImageID", ""))
                 for c in raw]
        LISTINGS.put(self.url, found, at, gen)
        return found

    LOG_LINES, LOG_CHARS = 40, 8000

    def ended(self, name: str) -> tuple[int | None, str]:
        """An exited container's exit code (None: not told) and the end of its output, bounded in lines,
        characters and time: why it ended, for the reason."""
        def go() -> tuple[int | None, str]:
            api = self.client().api
            code = ((api.inspect_container(name) or {}).get("State") or {}).get("ExitCode")
            out = api.logs(name, stdout=True, stderr=True, tail=self.LOG_LINES) or b""
            text = out.decode(errors="replace") if isinstance(out, bytes) else str(out)
            return (code if isinstance(code, int) and not isinstance(code, bool) else None), text[-self.LOG_CHARS:]
        return self._call(go, what="exited container")

    def pids(self, name: str) -> list[int]:
        """The host PIDs of a running container's processes (the engine's top): what nvidia-smi lists."""
        raw = self._call(lambda: self.client().api.top(name))
        titles = raw.get("Titles") or []
        if "PID" not in titles:
            raise AdapterError("DockerError", f"top of {name}: no PID column in {titles}")
        i = titles.index("PID")
        return [int(row[i]) for row in raw.get("Processes") or [] if str(row[i]).isdigit()]

    def remove(self, name: str) -> bool:
        """Force-remove; True if it existed."""
        try:
            self._call(lambda: self.client().api.remove_container(name, force=True, v=True))
            return True
        except NotFoundError:
            return False
        finally:
            LISTINGS.drop(self.url)

    def has_image(self, image: str) -> bool:
        return bool(self.image_id(image))

    def image_id(self, image: str) -> str:
        """The local image's ID ("" when it is not on this engine): a re-pulled tag has a new one."""
        return self.image_ref(image)[0]

    def image_ref(self, image: str) -> tuple[str, tuple[str, ...]]:
        """The local image's ID and its repo digests (repo@sha256:..., what a registry knows it by; none for an
        image built or imported here), in one inspect; ("", ()) when it is not on this engine."""
        try:
            found = self._call(lambda: self.client().api.inspect_image(image))
        except NotFoundError:
            return "", ()
        digests = found.get("RepoDigests") or []
        return str(found.get("Id", "?")), tuple(str(d) for d in digests if isinstance(d, str))[:8]

    def pull(self, image: str, *, timeout: float, heartbeat: Callable[[], None] | None = None,
             progress: Callable[[int, int], None] | None = None) -> None:
        """Pull with a deadline; ``progress(done_bytes, total_bytes)`` as layers arrive. The reference is read by
        docker-py itself (``registry:5000/repo``, ``repo:tag``, ``repo@sha256:…``); an image ID has no name a
        registry knows and is never pulled."""
        if is_image_id(image):
            raise ImageMissingError("PinnedImageGone", f"{image} is an image ID, not a name: nothing to pull it from")

        def go() -> None:
            layers: dict[str, tuple[int, int]] = {}
            for ev in self.client().api.pull(image, stream=True, decode=True):
                if "error" in ev:
                    raise AdapterError("ImagePullFailed", f"{image} on {self.node}: {ev['error']}"[:300])
                d = ev.get("progressDetail") or {}
                if ev.get("id") and d.get("total"):
                    layers[ev["id"]] = (int(d.get("current", 0)), int(d["total"]))
                if progress is not None and layers:
                    progress(sum(c for c, _ in layers.values()), sum(t for _, t in layers.values()))
        self._call(go, timeout=timeout, what=f"pull {image}", heartbeat=heartbeat)

    def run(self, spec: ContainerSpec) -> str:
        """Create and start without docker-py's silent auto-pull; a failed start leaves nothing behind."""
        opts = dict(spec.options)
        if opts.pop("gpus_all", False):
            opts["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
        if "ulimits" in opts:
            from docker.types import Ulimit
            opts["ulimits"] = [Ulimit(name=k, soft=v, hard=v) for k, v in opts["ulimits"].items()]

        def create() -> DockerContainer:
            # The entrypoint is set explicitly: vLLM's image has ENTRYPOINT ["vllm", "serve"], which would
            # otherwise take our command as its arguments.
            return self.client().containers.create(spec.image, spec.command[1:], entrypoint=spec.command[:1],
                                                   name=spec.name,
                                                   environment=spec.environment, labels=spec.labels, **opts)
        try:
            container = self._call(create)
            try:
                self._call(container.start, what="start")
            except AdapterError:
                self.remove(spec.name)
                raise
            return str(container.id)[:12]
        finally:
            LISTINGS.drop(self.url)

    def run_once(self, spec: ContainerSpec, *, timeout: float | None = None) -> tuple[int, str]:
        """Run a short-lived container to its end and remove it: (exit code, output). ``timeout``: how long it
        may run (default: the engine's call deadline)."""
        wait = timeout or self.timeout

        def go() -> tuple[int, str]:
            c = self.client().containers.create(spec.image, spec.command[1:], entrypoint=spec.command[:1],
                                                environment=spec.environment, labels=spec.labels, **spec.options)
            try:
                c.start()
                code = c.wait(timeout=wait).get("StatusCode", -1)
                return int(code), c.logs().decode(errors="replace")
            finally:
                c.remove(force=True)
        try:
            return self._call(go, timeout=wait + 5, what="helper container")
        finally:
            LISTINGS.drop(self.url)

    def exec(self, container: str, argv: list[str], *, env: dict[str, str] | None = None,
             detach: bool = False, what: str = "exec") -> tuple[int, str]:
        def go() -> tuple[int, str]:
            api = self.client().api
            ex = api.exec_create(container, argv, environment=env or None)
            if not detach:
                LISTINGS.await_exec(ex["Id"])
            out = api.exec_start(ex["Id"], detach=detach)
            if detach:
                return 0, ""
            code = api.exec_inspect(ex["Id"]).get("ExitCode")
            return int(code if code is not None else -1), (out or b"").decode(errors="replace")
        return self._call(go, what=what)
