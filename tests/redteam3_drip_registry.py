"""RT3-2 on the real engine (run by hand, under flock /tmp/engine-tests.lock):
a registry on 127.0.0.1 whose image `drip:1` sends its layers one byte a
second (never a stall of the agent's bound, never an end), and a small valid
image `fast:1`. While `drip:1` is being pulled, does the pull of `fast:1`
(another renter's) get a download slot?  Usage: python this.py PORT"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import sys
import tarfile
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def sha(b: bytes) -> str:
    return "sha256:" + hashlib.sha256(b).hexdigest()


def fast_image() -> tuple[bytes, dict[str, bytes]]:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        data = b"hello\n"
        info = tarfile.TarInfo("hello.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    layer_tar = raw.getvalue()
    layer = gzip.compress(layer_tar)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Cmd": ["/hello.txt"]},
            "rootfs": {"type": "layers", "diff_ids": [sha(layer_tar)]},
        }
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {
                "mediaType": "application/vnd.docker.container.image.v1+json",
                "size": len(config),
                "digest": sha(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                    "size": len(layer),
                    "digest": sha(layer),
                }
            ],
        }
    ).encode()
    return manifest, {sha(config): config, sha(layer): layer}


def drip_image() -> tuple[bytes, dict[str, bytes], set[str]]:
    layers = [f"drip-layer-{i}".encode() * 1000 for i in range(4)]
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [sha(x) for x in layers]},
        }
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {
                "mediaType": "application/vnd.docker.container.image.v1+json",
                "size": len(config),
                "digest": sha(config),
            },
            "layers": [
                {"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": len(x), "digest": sha(x)}
                for x in layers
            ],
        }
    ).encode()
    return manifest, {sha(config): config, **{sha(x): x for x in layers}}, {sha(x) for x in layers}


FAST_MANIFEST, FAST_BLOBS = fast_image()
DRIP_MANIFEST, DRIP_BLOBS, DRIPPING = drip_image()
MANIFESTS = {"fast": FAST_MANIFEST, "drip": DRIP_MANIFEST}
BLOBS = {**FAST_BLOBS, **DRIP_BLOBS}


class Registry(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # noqa: ANN002
        sys.stderr.write("registry: " + (args[0] % args[1:]) + "\n")

    def _send(self, body: bytes, ctype: str, digest: str | None = None, head: bool = False) -> None:
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        if digest:
            self.send_header("Docker-Content-Digest", digest)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def do_HEAD(self):  # noqa: N802
        self.do_GET(head=True)

    def do_GET(self, head: bool = False):  # noqa: N802
        parts = self.path.split("/")
        if self.path == "/v2/":
            return self._send(b"{}", "application/json", head=head)
        if len(parts) == 5 and parts[3] == "manifests" and parts[2] in MANIFESTS:
            body = MANIFESTS[parts[2]]
            return self._send(body, "application/vnd.docker.distribution.manifest.v2+json", sha(body), head)
        if len(parts) == 5 and parts[3] == "blobs" and parts[4] in BLOBS:
            body = BLOBS[parts[4]]
            if parts[4] not in DRIPPING or head:
                return self._send(body, "application/octet-stream", parts[4], head)
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                for byte in body:  # one byte a second: moving, never done
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(1)
            except OSError:
                return
            return
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Registry).serve_forever()
