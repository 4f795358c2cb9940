"""A big image in the test registry, made without `docker build`
(for the pull tests): the test busybox's layers, then a layer of one file of zeros
(GiBs unpacked, a few MB compressed: cheap to make, to store and to fetch)
and a layer of random bytes (incompressible: what a throttled relay makes
take seconds, so progress shows). Written straight to the registry through
its HTTP API, so the host's engine never holds its layers unless a test
pulls it; made once and kept (a later run finds the tag and skips).
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import io
import json
import os
import tarfile
import tempfile
from pathlib import Path

REGISTRY = "127.0.0.1:5000"
BASE = "gpuhost-test/busybox"  # scripts/build-test-images.sh pushes it
NAME, TAG = "gpuhost-test/big", "1"
ZERO_BYTES = 1024**3  # unpacked; about 1 MB compressed
RANDOM_BYTES = 48 * 1024**2
MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
LAYER = "application/vnd.docker.image.rootfs.diff.tar.gzip"


def _request(method: str, path: str, body=None, headers: dict | None = None) -> http.client.HTTPResponse:
    conn = http.client.HTTPConnection(REGISTRY, timeout=60)
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    response.read_body = response.read()  # type: ignore[attr-defined]
    conn.close()
    return response


SMALL = "gpuhost-test/small"  # busybox and one small layer of its own: an image id no other test uses


def present(name: str = NAME) -> bool:
    return _request("HEAD", f"/v2/{name}/manifests/{TAG}", headers={"Accept": MANIFEST}).status == 200


class _Hashing(io.RawIOBase):
    def __init__(self, out) -> None:
        self.out, self.sha, self.size = out, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.sha.update(data)
        self.size += len(data)
        self.out.write(data)
        return len(data)


class _Source(io.RawIOBase):
    def __init__(self, size: int, random: bool) -> None:
        self.left, self.random = size, random

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return os.urandom(n) if self.random else bytes(n)


def _layer(folder: Path, name: str, size: int, random: bool) -> tuple[Path, str, str, int]:
    """(file, digest, diff_id, compressed size) of a layer holding one file."""
    path = folder / f"{name}.tar.gz"
    with path.open("wb") as out:
        compressed = _Hashing(out)
        with gzip.GzipFile(fileobj=compressed, mode="wb", compresslevel=0 if random else 1, mtime=0) as gz:
            plain = _Hashing(gz)
            with tarfile.open(fileobj=plain, mode="w|") as tar:
                info = tarfile.TarInfo(f"data/{name}")
                info.size, info.mode = size, 0o644
                tar.addfile(info, _Source(size, random))
    return path, "sha256:" + compressed.sha.hexdigest(), "sha256:" + plain.sha.hexdigest(), compressed.size


def _upload(name: str, digest: str, body, size: int) -> None:
    if _request("HEAD", f"/v2/{name}/blobs/{digest}").status == 200:
        return
    started = _request("POST", f"/v2/{name}/blobs/uploads/")
    location = started.getheader("Location") or ""
    location = location.split(REGISTRY, 1)[-1]
    glue = "&" if "?" in location else "?"
    done = _request(
        "PUT",
        f"{location}{glue}digest={digest}",
        body=body,
        headers={"Content-Length": str(size), "Content-Type": "application/octet-stream"},
    )
    assert done.status == 201, (done.status, done.read_body)  # type: ignore[attr-defined]


def ensure(name: str = NAME) -> str:
    """The image's reference at the registry (made now if absent): NAME, or
    SMALL (a layer of 4 KiB of random bytes instead of the big ones)."""
    if present(name):
        return f"{REGISTRY}/{name}:{TAG}"
    base = json.loads(_request("GET", f"/v2/{BASE}/manifests/1", headers={"Accept": MANIFEST}).read_body)  # type: ignore[attr-defined]
    config = json.loads(_request("GET", f"/v2/{BASE}/blobs/{base['config']['digest']}").read_body)  # type: ignore[attr-defined]
    for layer in base["layers"]:
        mounted = _request("POST", f"/v2/{name}/blobs/uploads/?mount={layer['digest']}&from={BASE}")
        assert mounted.status == 201, mounted.status
    layers = list(base["layers"])
    with tempfile.TemporaryDirectory() as folder:
        made = (
            (("zeros", ZERO_BYTES, False), ("random", RANDOM_BYTES, True)) if name == NAME else (("own", 4096, True),)
        )
        for layer_name, size, random in made:
            path, digest, diff_id, length = _layer(Path(folder), layer_name, size, random)
            with path.open("rb") as body:
                _upload(name, digest, body, length)
            layers.append({"mediaType": LAYER, "size": length, "digest": digest})
            config["rootfs"]["diff_ids"].append(diff_id)
            config.setdefault("history", []).append({"created_by": f"gpuhost-test: {layer_name} layer"})
    config_bytes = json.dumps(config).encode()
    config_digest = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    _upload(name, config_digest, config_bytes, len(config_bytes))
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {"mediaType": base["config"]["mediaType"], "size": len(config_bytes), "digest": config_digest},
        "layers": layers,
    }
    put = _request("PUT", f"/v2/{name}/manifests/{TAG}", json.dumps(manifest).encode(), {"Content-Type": MANIFEST})
    assert put.status == 201, (put.status, put.read_body)  # type: ignore[attr-defined]
    return f"{REGISTRY}/{name}:{TAG}"


if __name__ == "__main__":
    print(ensure(), ensure(SMALL))
