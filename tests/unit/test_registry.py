"""The testbed's tiny registry (spark_testbed.registry) answers as `docker pull` asks: /v2/, the manifest by
tag and by digest (HEAD and GET), the blobs it names with their digests, 404s in the registry's error form;
its blobs come no faster than the rate, and what it sent is counted. Over a free port on 127.0.0.1."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import time
import urllib.error
import urllib.request

import pytest

from spark_testbed import registry


def saved() -> bytes:
    """A `docker save` archive in the legacy layout: one layer, its config, manifest.json."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as t:
        info = tarfile.TarInfo("etc/hello")
        info.size = 5
        t.addfile(info, io.BytesIO(b"hello"))
    diff = "sha256:" + hashlib.sha256(layer.getvalue()).hexdigest()
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": [diff]}, "history": [{"created_by": "test"}]})
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as t:
        for name, data in (("abc/layer.tar", layer.getvalue()), ("cfg.json", config.encode()),
                           ("manifest.json", json.dumps([{"Config": "cfg.json", "RepoTags": ["x:1"],
                                                          "Layers": ["abc/layer.tar"]}]).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def get(url: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def test_it_serves_the_saved_image_with_a_layer_on_top_at_the_rate() -> None:
    image = registry.from_saved(saved(), pad_bytes=30_000)
    manifest = json.loads(image.manifest)
    assert manifest["mediaType"] == registry.MANIFEST and len(manifest["layers"]) == 2
    config = json.loads(image.blobs[manifest["config"]["digest"]])
    unpacked = [gzip.decompress(image.blobs[x["digest"]]) for x in manifest["layers"]]
    assert config["rootfs"]["diff_ids"] == [registry.digest(x) for x in unpacked]
    assert len(config["history"]) == 2
    added, size = image.added
    rate = 100_000.0
    reg = registry.Registry(image, "tb/pulled", "slow", rate=rate)
    try:
        base = f"http://127.0.0.1:{reg.port}/v2"
        code, headers, _ = get(base + "/")
        assert code == 200 and headers["Docker-Distribution-API-Version"] == "registry/2.0"
        code, headers, body = get(f"{base}/tb/pulled/manifests/slow", "HEAD")
        assert (code, body, headers["Docker-Content-Digest"]) == (200, b"", image.digest)
        assert headers["Content-Type"] == registry.MANIFEST
        code, _, body = get(f"{base}/tb/pulled/manifests/{image.digest}")
        assert (code, body) == (200, image.manifest)
        start = time.monotonic()
        code, headers, body = get(f"{base}/tb/pulled/blobs/{added}")
        took = time.monotonic() - start
        assert (code, registry.digest(body), len(body)) == (200, added, size)
        assert took >= (size - rate / 20) / rate  # the last chunk goes without waiting
        assert reg.served.blob_bytes(added) == size and reg.served.blob_bytes() == size
        assert get(f"{base}/tb/pulled/manifests/other")[0] == 404
        assert get(f"{base}/tb/pulled/blobs/sha256:{'0' * 64}")[0] == 404
        code, _, body = get(f"{base}/someone/else/manifests/slow")
        assert code == 404 and json.loads(body)["errors"][0]["code"] == "NAME_UNKNOWN"
    finally:
        reg.stop()


def test_an_archive_without_its_files_is_refused() -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as t:
        data = json.dumps([{"Config": "missing.json", "Layers": []}]).encode()
        info = tarfile.TarInfo("manifest.json")
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
    with pytest.raises(KeyError):
        registry.from_saved(out.getvalue(), pad_bytes=1)
