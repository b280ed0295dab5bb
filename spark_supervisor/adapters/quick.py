"""The once-a-second watch between ticks: Ray's node list and vLLM's /health over kept-alive connections.

Plain http.client rather than httpx here: this runs every second for the daemon's whole life and must cost
next to nothing (about a quarter of httpx's CPU per request); so does the engine's /metrics each sweep
(adapters/vllm.py). Every other HTTP call goes through httpx.
"""

from __future__ import annotations

import functools
import http.client
import json
import ssl
import urllib.parse

import httpx
import tenacity

from ..model import EndpointObservation, RayObservation
from .health import observed
from .ray import parse


@functools.lru_cache(maxsize=64)
def path(url: str, to: str) -> str:
    """``to`` under the URL's own path (an endpoint behind a prefix keeps it), percent-encoded by httpx itself: a
    path http.client would refuse (non-ASCII, controls: InvalidURL, UnicodeEncodeError) is sent as the tick's
    httpx client sends it. Cached: httpx makes it in 31 µs, half of what the rest of a kept-alive GET costs here."""
    return httpx.URL(url).copy_with(query=None, fragment=None).raw_path.decode("ascii").rstrip("/") + to


@functools.cache
def tls() -> ssl.SSLContext:
    """The TLS context of every https endpoint: httpx's own (its CA list, not the environment's, as the tick's
    httpx client has), made once (about 20 ms of CPU each)."""
    return httpx.create_ssl_context(trust_env=False)


def connection(url: str, timeout: float) -> http.client.HTTPConnection:
    """A plain http.client connection to the URL's host (HTTPS, verified as httpx does, for an https URL)."""
    u = urllib.parse.urlsplit(url)
    if u.scheme == "https":
        return http.client.HTTPSConnection(u.hostname or "127.0.0.1", u.port or 443, timeout=timeout, context=tls())
    return http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port or 80, timeout=timeout)


class KeptAlive:
    """One kept-alive connection, used by one thread (the loop's): the quick check's, and the engine's /metrics
    read on the same server's (adapters.vllm), which so finds it open (uvicorn closes one idle for 5 s)."""

    LIMIT = 4 << 20  # an answer longer than this is not read further (and the connection is dropped)

    def __init__(self, url: str, timeout: float):
        self.url, self.timeout = url, timeout
        self.conn: http.client.HTTPConnection | None = None
        # A kept-alive connection the server closed: reconnect once, at once (a refused connect stays refused).
        # One Retrying kept for the connection: tenacity's decorator copies its own for every call, which costs
        # an idle daemon about 0.06 ms of CPU a request (measured, cold), a third of a kept-alive GET.
        self._retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type((http.client.RemoteDisconnected, BrokenPipeError,
                                                    ConnectionResetError)),
            stop=tenacity.stop_after_attempt(2), reraise=True)

    def get(self, to: str, *, headers: dict[str, str] | None = None, timeout: float | None = None,
            limit: int = LIMIT) -> tuple[int, bytes]:
        """The status and at most ``limit`` + 1 bytes of the body (more than ``limit``: cut short), each
        socket operation within ``timeout`` (default: the connection's)."""
        return self._retrying(self._get, to, headers or {}, timeout or self.timeout, limit)

    def _get(self, to: str, headers: dict[str, str], timeout: float, limit: int) -> tuple[int, bytes]:
        if self.conn is None:
            self.conn = connection(self.url, timeout)
        conn = self.conn
        try:
            conn.timeout = timeout  # a connect's
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            conn.request("GET", path(self.url, to), headers=headers)
            r = conn.getresponse()
            body = r.read(limit + 1)  # unlike read(), a bounded read returns a body cut short by the server
            if len(body) <= limit and r.length:
                missing = r.length
                r.close()
                raise http.client.IncompleteRead(body, missing)
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        if not r.isclosed():  # cut short: the rest of the body would be read as the next answer
            r.close()
            self.close()
        return r.status, body

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class QuickProbe:
    def __init__(self, ray_url: str, api_url: str, timeout: float = 1.0, api: KeptAlive | None = None):
        """api: the connection to the API server to use (shared with the engine's /metrics read, and closed by its
        owner), else its own."""
        self.timeout = timeout
        self.ray, self.api = KeptAlive(ray_url or "http://0.0.0.0", timeout), api or KeptAlive(api_url, timeout)
        self._own_api = api is None
        self.watch_ray = bool(ray_url)  # "" for a deployment without Ray

    def ray_nodes(self) -> RayObservation | None:
        if not self.watch_ray:
            return None
        try:
            status, body = self.ray.get("/api/v0/nodes?limit=100")
            if status != 200:
                return RayObservation(False, f"HTTP {status}")
            return parse(json.loads(body))
        except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
            return RayObservation(False, type(e).__name__)

    def health(self) -> EndpointObservation:
        try:
            status, _ = self.api.get("/health", timeout=self.timeout)  # the shared connection's is the API's
        except (OSError, http.client.HTTPException) as e:
            return observed(failure=e)
        return observed(status)

    def close(self) -> None:
        self.ray.close()
        if self._own_api:
            self.api.close()
