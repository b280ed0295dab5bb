"""One node's Docker engine (local socket or ssh://), through docker-py, every call bounded in time."""

from __future__ import annotations

import threading
import time
from typing import Any

import docker
import docker.errors
import paramiko
from docker.types import DeviceRequest

from ..commands import ContainerSpec
from ..model import Container
from . import AdapterError, ImageMissingError, NotFoundError, TransientError, Unreachable, within

# docker-py reaches an ssh:// engine through paramiko, whose transport thread wakes every 0.1 s (its
# `_active_check_timeout`) only to see whether it was closed: ten wakes a second per SSH engine for the daemon's
# whole life, measured at a quarter of its idle CPU. Once a second is enough: data wakes it at once, a close
# (packetizer.close) does not wait for the wake, and a dead peer is caught by every call's own deadline.
paramiko.Transport._active_check_timeout = 1.0


def _reason(e: BaseException) -> AdapterError:
    if isinstance(e, AdapterError):
        return e
    if isinstance(e, docker.errors.ImageNotFound):
        return ImageMissingError("ImageMissing", str(getattr(e, "explanation", "") or e))
    if isinstance(e, docker.errors.NotFound):
        return NotFoundError("NotFound", str(getattr(e, "explanation", "") or e))
    if isinstance(e, docker.errors.APIError):
        return AdapterError("DockerError", str(getattr(e, "explanation", "") or e))
    return Unreachable("DockerUnreachable", f"{type(e).__name__}: {e}"[:300])


class _Listings:
    """Each engine's container list, shared for a moment by everything in this process that asks it: the
    deployments placed on one node sweep it in the same pass, and one listing serves them all. Dropped at
    once when this process changes that engine's containers (so a plan never reads its own past)."""

    TTL_S = 0.5

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: dict[str, tuple[float, list[Container]]] = {}

    def get(self, url: str) -> list[Container] | None:
        with self.lock:
            at, found = self.seen.get(url, (0.0, []))
        return found if time.monotonic() - at < self.TTL_S else None

    def put(self, url: str, found: list[Container], at: float) -> None:
        with self.lock:
            self.seen[url] = (at, found)

    def drop(self, url: str) -> None:
        with self.lock:
            self.seen.pop(url, None)


LISTINGS = _Listings()


class DockerEngine:
    def __init__(self, node: str, url: str, *, timeout: float):
        self.node, self.url, self.timeout = node, url, timeout
        self._client: docker.DockerClient | None = None
        self._lock = threading.Lock()

    def client(self) -> docker.DockerClient:
        with self._lock:
            if self._client is None:
                try:
                    if self.url == "local":
                        self._client = docker.DockerClient(base_url="unix:///var/run/docker.sock",
                                                           timeout=int(self.timeout))
                    else:
                        self._client = docker.DockerClient(base_url=self.url, timeout=int(self.timeout),
                                                           max_pool_size=4)
                except Exception as e:  # docker-py raises DockerException, paramiko's, OSError...
                    raise _reason(e) from None
                # Its requests.Session would read the environment's proxies (and ~/.netrc) on every request:
                # a quarter of a listing's CPU, for settings no Docker socket or SSH channel takes.
                self._client.api.trust_env = False
            return self._client

    @property
    def connected(self) -> bool:
        return self._client is not None

    def reset(self) -> None:
        """Drop the connection after a failure; the next call reconnects."""
        with self._lock:
            c, self._client = self._client, None
        if c is not None:
            try:
                c.close()
            except Exception:
                pass

    def _call(self, fn: Any, *, timeout: float | None = None, what: str = "docker",
              heartbeat: Any = None) -> Any:
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

    def containers(self) -> list[Container]:
        kept = LISTINGS.get(self.url)
        if kept is not None:
            return kept
        at = time.monotonic()  # taken before asking: a change made while the answer travels is not hidden
        raw = self._call(lambda: self.client().api.containers(all=True))
        found = [Container(id=c["Id"][:12], name=(c.get("Names") or ["/?"])[0].lstrip("/"),
                           image=c.get("Image", ""), state=c.get("State", ""), labels=c.get("Labels") or {},
                           image_id=c.get("ImageID", ""))
                 for c in raw]
        LISTINGS.put(self.url, found, at)
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
        return self._call(go, what="exited container")  # type: ignore[no-any-return]

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

    def pull(self, image: str, *, timeout: float, heartbeat: Any = None,
             progress: Any = None) -> None:
        """Pull with a deadline; ``progress(done_bytes, total_bytes)`` as layers arrive."""
        repo, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "latest")

        def go() -> None:
            layers: dict[str, tuple[int, int]] = {}
            for ev in self.client().api.pull(repo, tag=tag, stream=True, decode=True):
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

        def create() -> Any:
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
            return self._call(go, timeout=wait + 5, what="helper container")  # type: ignore[no-any-return]
        finally:
            LISTINGS.drop(self.url)

    def exec(self, container: str, argv: list[str], *, env: dict[str, str] | None = None,
             detach: bool = False, what: str = "exec") -> tuple[int, str]:
        def go() -> tuple[int, str]:
            api = self.client().api
            ex = api.exec_create(container, argv, environment=env or None)
            out = api.exec_start(ex["Id"], detach=detach)
            if detach:
                return 0, ""
            code = api.exec_inspect(ex["Id"]).get("ExitCode")
            return int(code if code is not None else -1), (out or b"").decode(errors="replace")
        return self._call(go, what=what)  # type: ignore[no-any-return]
