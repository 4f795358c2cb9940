"""A certificate authority of a test's own and a server certificate for an IP
address, made with the openssl command line, for a local marketplace that
serves HTTPS to another machine (the booted modern host): an agent takes
plain http only from a marketplace on its own machine."""

from __future__ import annotations

import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class MarketTls:
    ca: Path  # the CA's certificate (PEM): what a client trusts
    cert: Path
    key: Path

    def server(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        return context

    def client(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca))


def make_market_tls(folder: Path, address: str) -> MarketTls:
    """A CA and a certificate for `address` (an IP), valid two days."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    openssl("req", "-x509", *curve, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=gpuhost test CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")  # fmt: skip
    openssl("req", *curve, "-keyout", "market.key", "-out", "market.csr", "-subj", f"/CN={address}")
    (folder / "market.ext").write_text(
        f"subjectAltName=IP:{address}\nextendedKeyUsage=serverAuth\nbasicConstraints=critical,CA:FALSE\n"
    )
    openssl("x509", "-req", "-in", "market.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "market.pem", "-days", "2", "-extfile", "market.ext")  # fmt: skip
    return MarketTls(folder / "ca.pem", folder / "market.pem", folder / "market.key")
