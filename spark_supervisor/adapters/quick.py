"""The once-a-second watch between ticks: Ray's node list and vLLM's /health over kept-alive connections.

A socket and httptools' parser rather than httpx here: this runs every second for the daemon's whole life and must
cost next to nothing (a tenth of httpx's CPU per request); so does the engine's /metrics each sweep
(adapters/vllm.py). Every other HTTP call goes through httpx.

Heavy but earned: it holds the idle goal (<= 0.35 % of a core with several deployments, docs/benchmarks.md).
Measure before you simplify it.
"""

from __future__ import annotations

import functools
import http.client
import json
import re
import select
import socket
import ssl
import time
from typing import NamedTuple

import httptools
import httpx

from ..model import EndpointObservation, EndpointState, RayObservation
from . import probe
from .health import observed
from .ray import parse


def _unreadable(e: Exception) -> RayObservation | None:
    return RayObservation(False, str(e))


class Target(NamedTuple):
    host: str  # to connect to (IDNA)
    port: int
    tls: bool
    netloc: str  # the Host header
    path: str  # the endpoint's own path, which every request goes under


@functools.lru_cache(maxsize=64)
def target(url: str) -> Target:
    """Where the URL's requests go, parsed once by httpx, as the tick's httpx client sends them: the Host header
    with IDNA, brackets and no default port; the path percent-encoded by httpx (one http.client would refuse,
    non-ASCII or controls, is sent as httpx sends it), and an endpoint behind a prefix keeps it."""
    u = httpx.URL(url)
    tls_ = u.scheme == "https"
    return Target(u.raw_host.decode("ascii") or "127.0.0.1", u.port or (443 if tls_ else 80), tls_,
                  u.netloc.decode("ascii"), u.copy_with(query=None, fragment=None).raw_path.decode("ascii").rstrip("/"))


@functools.cache
def tls() -> ssl.SSLContext:
    """The TLS context of every https endpoint: httpx's own (its CA list, not the environment's, as the tick's
    httpx client has), made once (about 20 ms of CPU each)."""
    return httpx.create_ssl_context(trust_env=False)


_SENDABLE = re.compile(r"[!-9;-~]+: [ -~]*")  # a header http.client would send (no line breaks, no controls)


class Answer:
    """httptools' callbacks for one answer: its body up to a bound, whether it is whole, and whether the server keeps
    the connection."""

    __slots__ = ("parser", "body", "size", "limit", "headers", "whole", "framed", "keep")

    def __init__(self, limit: int):
        self.parser = httptools.HttpResponseParser(self)
        self.body: list[bytes] = []
        self.size, self.limit = 0, limit
        self.headers = self.whole = self.framed = self.keep = False

    def on_header(self, name: bytes, _value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self.framed = True  # else the body runs to the connection's close

    def on_headers_complete(self) -> None:
        self.headers, self.keep = True, self.parser.should_keep_alive()

    def on_body(self, chunk: bytes) -> None:
        if self.size <= self.limit:
            self.body.append(chunk[:self.limit + 1 - self.size])
        self.size += len(chunk)

    def on_message_complete(self) -> None:
        self.whole = True


class KeptAlive:
    """One kept-alive HTTP/1.1 connection, used by one thread (the loop's): the quick check's, and the engine's
    /metrics read on the same server's (adapters.vllm), which so finds it open (uvicorn closes one idle for 5 s).
    A socket and httptools' parser (llhttp, uvicorn's): a third of http.client's CPU a request (measured, cold:
    http.client's header parsing alone cost more than the whole exchange here)."""

    LIMIT = 4 << 20  # an answer longer than this is not read further (and the connection is dropped)

    def __init__(self, url: str, timeout: float):
        self.url, self.timeout = url, timeout
        self.sock: socket.socket | None = None
        self._idle = select.poll()  # the kept socket's, registered at connect
        self._requests: dict[tuple[str, tuple[tuple[str, str], ...]], bytes] = {}

    def get(self, to: str, *, headers: dict[str, str] | None = None, timeout: float | None = None,
            limit: int = LIMIT) -> tuple[int, bytes]:
        """The status and at most ``limit`` + 1 bytes of the body (more than ``limit``: cut short), each socket
        operation and the answer as a whole within ``timeout`` (default: the connection's). Raises OSError or
        HTTPException: RemoteDisconnected (closed before an answer), IncompleteRead (closed within one),
        HTTPException (not HTTP). Nothing is retried: a kept connection the server has closed (an idle timeout, a
        restart) is found so before the request is sent, as urllib3's pool does, and a new one made; a close
        that crosses the request is that check's failure, and the next check connects again."""
        request = self._request(to, headers or {})
        if self.sock is not None and self._idle.poll(0):  # poll, not select: any descriptor number
            self.close()  # readable while idle: closed by the server, or holding what was never asked for
        return self._get(request, timeout or self.timeout, limit)

    def _request(self, to: str, headers: dict[str, str]) -> bytes:
        key = (to, tuple(headers.items()))
        if (request := self._requests.get(key)) is None:
            where = target(self.url)
            lines = [f"GET {where.path}{to} HTTP/1.1", f"Host: {where.netloc}",
                     "Accept-Encoding: identity", *(f"{k}: {v}" for k, v in headers.items())]
            if not all(_SENDABLE.fullmatch(line) for line in lines[1:]):
                raise http.client.HTTPException("a header that cannot be sent")
            request = self._requests[key] = "\r\n".join([*lines, "", ""]).encode("ascii")
        return request

    def _connect(self, timeout: float) -> socket.socket:
        where = target(self.url)
        sock = socket.create_connection((where.host, where.port), timeout)
        if where.tls:
            try:
                sock = tls().wrap_socket(sock, server_hostname=where.host)
            except BaseException:
                sock.close()
                raise
        self._idle = select.poll()
        self._idle.register(sock, select.POLLIN)
        self.sock = sock
        return sock

    def _get(self, request: bytes, timeout: float, limit: int) -> tuple[int, bytes]:
        answer, got, deadline = Answer(limit), False, time.monotonic() + timeout
        try:
            sock = self.sock or self._connect(timeout)
            sock.settimeout(timeout)
            sock.sendall(request)
            while not answer.whole and answer.size <= limit:
                data = sock.recv(65536)
                if not data:
                    if not got:
                        raise http.client.RemoteDisconnected("closed without an answer")
                    if answer.headers and not answer.framed:  # its body ran to the close
                        answer.whole, answer.keep = True, False
                        break
                    raise http.client.IncompleteRead(b"".join(answer.body))
                got = True
                answer.parser.feed_data(data)
                if not answer.whole and time.monotonic() > deadline:  # a server that drips it out
                    raise TimeoutError("the answer took longer than its timeout")
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as e:
            self.close()
            raise http.client.HTTPException(f"not an HTTP answer: {e}") from e
        except (OSError, http.client.HTTPException):
            self.close()
            raise
        if not (answer.whole and answer.keep):  # cut short: the rest would be read as the next answer
            self.close()
        return answer.parser.get_status_code(), b"".join(answer.body)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class QuickProbe:
    def __init__(self, ray_url: str, api_url: str, timeout: float = 1.0, api: KeptAlive | None = None):
        """api: the connection to the API server to use (shared with the engine's /metrics read, and closed by its
        owner), else its own."""
        self.timeout = timeout
        self.ray, self.api = KeptAlive(ray_url or "http://0.0.0.0", timeout), api or KeptAlive(api_url, timeout)
        self._own_api = api is None
        self.watch_ray = bool(ray_url)  # "" for a deployment without Ray

    @probe("quick ray nodes", _unreadable)
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

    @probe("quick health", lambda e: EndpointObservation(EndpointState.UNKNOWN, str(e)))
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
