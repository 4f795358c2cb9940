"""The mutual TLS between a Swarm environment's leader and its workers'
doors (docs/swarm.md, streams/door.py, runtime/door_client.py).

An environment CA, made by the leader's install and whose private key only
the leader's machine holds (`ca.key`, 0600, never read by the agent), signs
one certificate per machine: the leader's for TLS clients alone (extended
key usage clientAuth), each worker's for TLS servers alone (serverAuth). So
the door serves only a client holding the leader's certificate, the leader
talks only to a door holding a worker's, and a worker's certificate cannot
open another worker's door. The leader's install writes a worker's key,
certificate and the CA's certificate into one bundle (`bundle`), which the
worker's install takes (`worker`); re-installing rotates: a new leader CA
(after removing `ca.key`) needs new bundles on every worker. Nothing is
derived from the environment's key; the key is still asked of the leader
on every request, inside the TLS.

Run by install.sh: `python -m gpuhost_agent.service.swarm_tls leader DIR`,
`... bundle DIR OUT`, `... worker BUNDLE DIR`.
"""

from __future__ import annotations

import datetime
import os
import ssl
import sys
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpuhost_agent.service.config import ConfigError

CA_CERT, CA_KEY, CERT, KEY = "ca.crt", "ca.key", "cert.pem", "key.pem"
USAGE = {"leader": ExtendedKeyUsageOID.CLIENT_AUTH, "worker": ExtendedKeyUsageOID.SERVER_AUTH}
YEARS = 10  # the CA's and each machine's; rotated by re-installing


def make_ca(directory: Path) -> None:
    """The environment CA in `directory`, unless one is already there."""
    if (directory / CA_KEY).exists():
        return
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"gpuhost-agent Swarm CA {os.urandom(6).hex()}")])
    cert = (
        _builder(name, name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .sign(key, hashes.SHA256())
    )
    _write(directory / CA_KEY, _key_pem(key), secret=True)
    _write(directory / CA_CERT, cert.public_bytes(serialization.Encoding.PEM))


def issue(directory: Path, role: str) -> tuple[bytes, bytes]:
    """(key, certificate) in PEM for one machine of `role`, signed by the CA in `directory`."""
    ca_key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"gpuhost-agent Swarm {role}")])
    cert = (
        _builder(name, ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([USAGE[role]]), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    return _key_pem(key), cert.public_bytes(serialization.Encoding.PEM)


def install_leader(directory: Path) -> None:
    """The leader's own: the CA (kept) and its client certificate."""
    make_ca(directory)
    key, cert = issue(directory, "leader")
    _write(directory / KEY, key, secret=True)
    _write(directory / CERT, cert)


def bundle(directory: Path) -> bytes:
    """A new worker's key, certificate and the CA's certificate, in one PEM."""
    key, cert = issue(directory, "worker")
    return key + cert + (directory / CA_CERT).read_bytes()


def install_worker(source: Path, directory: Path) -> None:
    """A worker's bundle into `directory`, checked: the key is the
    certificate's, the certificate a worker's, signed by the bundle's CA."""
    data = source.read_bytes()
    certs = x509.load_pem_x509_certificates(data)
    if len(certs) != 2:
        raise ConfigError(f"{source}: a worker's bundle holds a key and two certificates (install.sh on the leader)")
    key = serialization.load_pem_private_key(data, None)
    leaf, ca = certs
    if key.public_key() != leaf.public_key():
        raise ConfigError(f"{source}: the key is not the certificate's")
    try:
        leaf.verify_directly_issued_by(ca)
        usages = list(leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except (ValueError, TypeError, InvalidSignature, x509.ExtensionNotFound):
        raise ConfigError(f"{source}: the certificate is not signed by the bundle's CA") from None
    if usages != [USAGE["worker"]] or not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{source}: not a worker's certificate and key")
    _write(directory / KEY, _key_pem(key), secret=True)
    _write(directory / CERT, leaf.public_bytes(serialization.Encoding.PEM))
    _write(directory / CA_CERT, ca.public_bytes(serialization.Encoding.PEM))


def server_context(directory: Path) -> ssl.SSLContext:
    """A worker's door: its certificate; a client's must be the leader's."""
    _role(directory, "worker")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(directory / CA_CERT))
    context.verify_mode = ssl.CERT_REQUIRED  # OpenSSL checks the client's clientAuth usage
    context.load_cert_chain(directory / CERT, directory / KEY)
    return context


def client_context(directory: Path) -> ssl.SSLContext:
    """The leader: its certificate; a door's must be a worker's (serverAuth),
    by the CA alone (the leader reaches doors by address, no name to check)."""
    _role(directory, "leader")
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(directory / CA_CERT))
    context.check_hostname = False
    context.load_cert_chain(directory / CERT, directory / KEY)
    return context


def context_or_exit(role: str, directory: Path) -> ssl.SSLContext:
    """The agent's start: the leader's or the worker's context, or an exit saying why not."""
    try:
        return server_context(directory) if role == "worker" else client_context(directory)
    except (ConfigError, OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise SystemExit(f"GPUHOST_SWARM={role}: {exc}") from None


def _role(directory: Path, role: str) -> None:
    try:
        cert = x509.load_pem_x509_certificate((directory / CERT).read_bytes())
        (directory / CA_CERT).read_bytes()
        (directory / KEY).stat()
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"the Swarm's TLS files in {directory} ({CERT}, {KEY}, {CA_CERT}) are missing or unreadable: {exc}; "
            f"install.sh --swarm {role} makes them (docs/swarm.md)"
        ) from None
    try:
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        usages = x509.ExtendedKeyUsage([])
    if list(usages) != [USAGE[role]]:
        raise ConfigError(f"{directory / CERT} is not a Swarm {role}'s certificate")


def _builder(subject: x509.Name, issuer: x509.Name, public: ec.EllipticCurvePublicKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=365 * YEARS))
    )


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, *, secret: bool = False) -> None:
    """Written whole then renamed; 0600 for a key, 0644 for a certificate."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.new")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600 if secret else 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(temporary, path)


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["leader"] and len(argv) == 2:
            install_leader(Path(argv[1]))
        elif argv[:1] == ["bundle"] and len(argv) == 3:
            _write(Path(argv[2]), bundle(Path(argv[1])), secret=True)
        elif argv[:1] == ["worker"] and len(argv) == 3:
            install_worker(Path(argv[1]), Path(argv[2]))
        else:
            print("usage: swarm_tls leader DIR | bundle DIR OUT | worker BUNDLE DIR", file=sys.stderr)
            return 2
    except (ConfigError, OSError, ValueError, TypeError) as exc:
        print(f"Swarm TLS: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
