"""A tiny image registry for the testbed: CI reaches none, yet a pull must be tested (a pull that outlasts
systemd's start timeout, tests/integration/test_systemd_pull.py). It speaks just enough of the Docker
Registry HTTP API v2 for `docker pull` (``/v2/``, a manifest by tag or digest, blobs; GET and HEAD), read
only, for one image: one the testbed has, taken from `docker save`, served as a schema 2 manifest with a
layer of random bytes on top (new content each time, so the engines cannot skip it as "Already exists").
Every blob is sent at a fixed byte rate, a slow link, and the bytes sent are counted: a test can see that the
pull went through here. Engines trust plain HTTP to 127.0.0.0/8 by default (Docker's insecure registries)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import tarfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG = "application/vnd.docker.container.image.v1+json"
LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"
_PATH = re.compile(r"^/v2/(?P<name>.+)/(?P<kind>manifests|blobs)/(?P<ref>[^/]+)$")


def digest(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()


@dataclass
class Image:
    """One image as a registry holds it: its manifest and the blobs it names (the config and the layers)."""
    manifest: bytes
    blobs: dict[str, bytes]

    @property
    def digest(self) -> str:
        return digest(self.manifest)

    @property
    def added(self) -> tuple[str, int]:
        """The layer added on top (digest, size): what every pull must download."""
        top = json.loads(self.manifest)["layers"][-1]
        return str(top["digest"]), int(top["size"])


def _tar_of(name: str, content: bytes) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as t:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(content), 0o644, 0
        t.addfile(info, io.BytesIO(content))
    return out.getvalue()


def from_saved(saved: bytes, pad_bytes: int) -> Image:
    """The image of a `docker save` archive (its manifest.json: the config and the layers' paths, in the
    legacy and the OCI layout alike), with a layer of ``pad_bytes`` random bytes added on top."""
    with tarfile.open(fileobj=io.BytesIO(saved)) as t:
        def read(path: str) -> bytes:
            f = t.extractfile(path)
            if f is None:
                raise ValueError(f"{path}: not a file in the saved image")
            return f.read()
        (entry,) = json.loads(read("manifest.json"))
        config: dict[str, Any] = json.loads(read(entry["Config"]))
        layers = [read(p) for p in entry["Layers"]]  # uncompressed diffs: their sha256 are the diff_ids
    layers.append(_tar_of(".spark-testbed-pulled", os.urandom(pad_bytes)))  # random: gzip leaves its size
    config["rootfs"]["diff_ids"] = [digest(x) for x in layers]
    config.setdefault("history", []).append({"created_by": "spark-testbed registry: the pulled layer"})
    blobs = {}
    described = []
    for layer in layers:
        packed = gzip.compress(layer, mtime=0)
        blobs[digest(packed)] = packed
        described.append({"mediaType": LAYER, "size": len(packed), "digest": digest(packed)})
    config_blob = json.dumps(config).encode()
    blobs[digest(config_blob)] = config_blob
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST,
                "config": {"mediaType": CONFIG, "size": len(config_blob), "digest": digest(config_blob)},
                "layers": described}
    return Image(json.dumps(manifest, indent=2).encode(), blobs)


@dataclass
class Served:
    """What the registry sent, per path (bytes of bodies handed to the connection), and the requests it
    answered."""
    bytes: dict[str, int] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, path: str, n: int) -> None:
        with self.lock:
            self.bytes[path] = self.bytes.get(path, 0) + n

    def blob_bytes(self, blob: str = "") -> int:
        """Bytes of blobs sent (of that blob's alone, given its digest)."""
        with self.lock:
            return sum(n for p, n in self.bytes.items() if "/blobs/" in p and p.endswith(blob))


class Registry:
    """The registry on 127.0.0.1 (a free port unless one is given), serving ``image`` as ``name:tag`` with
    every body sent at ``rate`` bytes a second, each connection on its own (two engines pulling at once each
    get the rate). ``stop()`` ends it; a pull still running then fails."""

    def __init__(self, image: Image, name: str, tag: str, rate: float, port: int = 0):
        self.image, self.name, self.tag, self.rate = image, name, tag, rate
        self.served = Served()
        registry = self

        class Handler(BaseHTTPRequestHandler):
            timeout = 60  # a socket read or write that stalls this long ends the request
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                registry.answer(self, body=True)

            def do_HEAD(self) -> None:
                registry.answer(self, body=False)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
                pass  # counted in ``served`` instead of printed

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="registry", daemon=True)
        self._thread.start()

    @property
    def reference(self) -> str:
        """The image's name as an engine pulls it."""
        return f"127.0.0.1:{self.port}/{self.name}:{self.tag}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)

    def answer(self, h: BaseHTTPRequestHandler, *, body: bool) -> None:
        path = h.path.split("?", 1)[0]
        with self.served.lock:
            self.served.requests.append(f"{h.command} {path}")
        if path in ("/v2", "/v2/"):
            return self._send(h, 200, b"{}", "application/json", body=body, throttled=False)
        m = _PATH.match(path)
        if m is None or m["name"] != self.name:
            return self._error(h, 404, "NAME_UNKNOWN", body)
        if m["kind"] == "manifests":
            if m["ref"] not in (self.tag, self.image.digest):
                return self._error(h, 404, "MANIFEST_UNKNOWN", body)
            return self._send(h, 200, self.image.manifest, MANIFEST, body=body, throttled=False,
                              digest_=self.image.digest)
        blob = self.image.blobs.get(m["ref"])
        if blob is None:
            return self._error(h, 404, "BLOB_UNKNOWN", body)
        return self._send(h, 200, blob, "application/octet-stream", body=body, throttled=True, digest_=m["ref"])

    def _error(self, h: BaseHTTPRequestHandler, code: int, what: str, body: bool) -> None:
        text = json.dumps({"errors": [{"code": what, "message": what.lower().replace("_", " ")}]}).encode()
        self._send(h, code, text, "application/json", body=body, throttled=False)

    def _send(self, h: BaseHTTPRequestHandler, code: int, data: bytes, ctype: str, *, body: bool, throttled: bool,
              digest_: str = "") -> None:
        h.send_response(code)
        h.send_header("Docker-Distribution-API-Version", "registry/2.0")
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(data)))
        if digest_:
            h.send_header("Docker-Content-Digest", digest_)
        h.end_headers()
        if not body:
            return
        # Counted as handed to the connection, before the write: the client may have it all (and its
        # test may look) before a write returns.
        if not throttled:
            self.served.add(h.path, len(data))
            h.wfile.write(data)
            return
        # The slow link: chunks of a twentieth of a second's bytes, each sent when the rate allows it.
        chunk = max(1, int(self.rate / 20))
        start = time.monotonic()
        for at in range(0, len(data), chunk):
            ahead = start + at / self.rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)  # the throttle itself, not a wait for something to happen
            self.served.add(h.path, min(chunk, len(data) - at))
            h.wfile.write(data[at:at + chunk])
            h.wfile.flush()
