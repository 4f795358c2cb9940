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

import base64
import contextlib
import datetime
import json
import os
import re
import ssl
import sys
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.runtime.door_client import node_name
from gpuhost_agent.service.config import ConfigError

log = get_logger(__name__)
NODE_ID = re.compile(r"^[a-z0-9]{10,64}$")  # Swarm's node ids: 25 lowercase letters and digits

CA_CERT, CA_KEY, CERT, KEY = "ca.crt", "ca.key", "cert.pem", "key.pem"
CRL, ISSUED, REVOKED = "revoked.crl", "issued.json", "revoked.json"  # the leader's: its CA's records
LEADER_RECORD = "@leader"  # whom ISSUED names for a leader's certificate (a node id never starts with @)
CRL_HEADER_BYTES = 8192  # the list's base64 in a request head (the door reads 16 KiB of it)
USAGE = {"leader": ExtendedKeyUsageOID.CLIENT_AUTH, "worker": ExtendedKeyUsageOID.SERVER_AUTH}
CA_YEARS = 10  # the CA's; a new one needs new bundles on every worker
MACHINE_DAYS = 365  # each machine's certificate: renewed by a new bundle (a worker) or a re-install (the leader)
RENEW_DAYS = 30  # doctor fails, and the agent warns, this close to a certificate's end
RENEWAL = {
    "leader": "install.sh --swarm leader again on this machine makes it a new certificate",
    "worker": "on the leader: install.sh --swarm-worker-bundle FILE --swarm-node-id <this node>; "
    "here: install.sh --swarm worker --swarm-key-file ... --swarm-tls-file FILE",
}


def make_ca(directory: Path) -> None:
    """The environment CA in `directory`, unless one is already there."""
    if (directory / CA_KEY).exists():
        return
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"gpuhost-agent Swarm CA {os.urandom(6).hex()}")])
    cert = (
        _builder(name, name, key.public_key(), days=365 * CA_YEARS)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .sign(key, hashes.SHA256())
    )
    _write(directory / CA_KEY, _key_pem(key), secret=True)
    _write(directory / CA_CERT, cert.public_bytes(serialization.Encoding.PEM))


def issue(directory: Path, role: str, node: str | None = None) -> tuple[bytes, bytes]:
    """(key, certificate) in PEM for one machine of `role`, signed by the CA in
    `directory`; a worker's names its Swarm node (node_name), and is recorded
    under it so that it can be revoked."""
    ca_key, ca_cert = _ca(directory)
    if role == "worker" and not (node and NODE_ID.fullmatch(node)):
        raise ConfigError(f"a worker's certificate names its Swarm node id (docker node ls), not {node!r}")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"gpuhost-agent Swarm {role}")])
    builder = (
        _builder(name, ca_cert.subject, key.public_key(), days=MACHINE_DAYS)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([USAGE[role]]), critical=True)
    )
    if node:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.DNSName(node_name(node))]), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    issued = _records(directory / ISSUED)
    named = node or LEADER_RECORD  # the leader's too: a certificate it had before is revoked at its next install
    _write(directory / ISSUED, json.dumps({**issued, format(cert.serial_number, "x"): named}, indent=1).encode())
    return _key_pem(key), cert.public_bytes(serialization.Encoding.PEM)


def install_leader(directory: Path) -> None:
    """The leader's own: the CA (kept), its client certificate (new at every
    install: the leader's rotation), and the CA's revocation list, which now
    names every certificate the leader had before (a copy of an old one, key
    and all, opens no door once a worker has the list: crl_header)."""
    make_ca(directory)
    try:  # the one this install replaces, whether or not ISSUED recorded it (installs before it did)
        replaced = [format(x509.load_pem_x509_certificate((directory / CERT).read_bytes()).serial_number, "x")]
    except (OSError, ValueError):
        replaced = []
    key, cert = issue(directory, "leader")
    _write(directory / KEY, key, secret=True)
    _write(directory / CERT, cert)
    current = format(x509.load_pem_x509_certificate(cert).serial_number, "x")
    earlier = [s for s, named in _records(directory / ISSUED).items() if named == LEADER_RECORD and s != current]
    earlier += [serial for serial in replaced if serial != current and serial not in earlier]
    _revoked(directory, earlier, LEADER_RECORD)


def bundle(directory: Path, node: str) -> bytes:
    """A new worker's key, certificate (naming `node`), the CA's certificate and its revocation list, in one PEM."""
    key, cert = issue(directory, "worker", node)
    return key + cert + (directory / CA_CERT).read_bytes() + (directory / CRL).read_bytes()


def revoke(directory: Path, node: str) -> list[str]:
    """Every certificate issued to `node` revoked (a retired worker), without a new
    CA: the serials added to the list the leader's TLS checks; those revoked now."""
    issued = _records(directory / ISSUED)
    serials = sorted(serial for serial, named in issued.items() if named == node)
    if not serials:
        raise ConfigError(f"no certificate of this CA names node {node!r} ({directory / ISSUED})")
    _revoked(directory, serials, node)
    return serials


def _revoked(directory: Path, serials: list[str], named: str) -> None:
    """`serials` added to the CA's revoked records, and its list written again."""
    _write(directory / REVOKED, json.dumps({**_records(directory / REVOKED), **dict.fromkeys(serials, named)}).encode())
    write_crl(directory)


def write_crl(directory: Path) -> None:
    """The CA's revocation list, signed with its key, valid as long as the CA."""
    ca_key, ca_cert = _ca(directory)
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca_cert.subject)
        .last_update(now - datetime.timedelta(hours=1))
        .next_update(ca_cert.not_valid_after_utc)
    )
    serials = _records(directory / REVOKED)
    # Its number: how many it revokes. Revocations are only ever added, so a list with more is newer.
    builder = builder.add_extension(x509.CRLNumber(len(serials)), critical=False)
    for serial in serials:
        revoked = x509.RevokedCertificateBuilder().serial_number(int(serial, 16)).revocation_date(now).build()
        builder = builder.add_revoked_certificate(revoked)
    _write(directory / CRL, builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))


def expires(directory: Path) -> datetime.datetime:
    """When this machine's certificate ends."""
    return x509.load_pem_x509_certificate((directory / CERT).read_bytes()).not_valid_after_utc


def expiry_problem(directory: Path, now: datetime.datetime | None = None) -> str | None:
    """Why this machine's certificate needs renewing (RENEW_DAYS before its end), or None."""
    left = expires(directory) - (now or datetime.datetime.now(datetime.timezone.utc))
    if left > datetime.timedelta(days=RENEW_DAYS):
        return None
    when = "ended" if left.total_seconds() <= 0 else f"ends in {left.days} day(s)"
    return f"this machine's Swarm certificate ({directory / CERT}) {when}"


def install_worker(source: Path, directory: Path, node: str | None = None) -> None:
    """A worker's bundle into `directory`, checked: the key is the
    certificate's, the certificate a worker's, signed by the bundle's CA, and
    naming this machine's node (`node`, when known)."""
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
    try:
        names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName
        )
    except x509.ExtensionNotFound:
        names = []
    if node and names != [node_name(node)]:
        raise ConfigError(f"{source}: made for node {names or 'none'}, not this machine's ({node}): make one for it")
    _write(directory / KEY, _key_pem(key), secret=True)
    _write(directory / CERT, leaf.public_bytes(serialization.Encoding.PEM))
    _write(directory / CA_CERT, ca.public_bytes(serialization.Encoding.PEM))
    if b"-----BEGIN X509 CRL-----" in data:
        accept_crl(directory, b"-----BEGIN X509 CRL-----" + data.split(b"-----BEGIN X509 CRL-----", 1)[1])


def _number(crl: x509.CertificateRevocationList) -> int:
    """A list's CRL number (how many it revokes); 0 for one without (made before lists had one)."""
    try:
        return crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number
    except x509.ExtensionNotFound:
        return 0


def crl_header(directory: Path) -> str | None:
    """The leader's revocation list as one header value (base64 of its DER),
    sent with the leader's requests so that every worker holds it; None when
    there is none, or it is too long for a request head (CRL_HEADER_BYTES)."""
    try:
        crl = x509.load_pem_x509_crl((directory / CRL).read_bytes())
    except (OSError, ValueError):
        return None
    value = base64.b64encode(crl.public_bytes(serialization.Encoding.DER)).decode()
    return value if len(value) <= CRL_HEADER_BYTES else None


def accept_crl(directory: Path, data: bytes) -> bool:
    """A worker takes a revocation list (PEM, or DER in base64 as the leader's
    header carries it) signed by its CA and newer than the one it has; whether
    it took it. Anything else is ignored: only the CA's key makes a list."""
    try:
        if data.startswith(b"-----BEGIN"):
            crl = x509.load_pem_x509_crl(data)
        else:
            crl = x509.load_der_x509_crl(base64.b64decode(data, validate=True))
        ca = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
        if crl.issuer != ca.subject or not crl.is_signature_valid(ca.public_key()):  # type: ignore[arg-type]
            return False
    except (OSError, ValueError, TypeError):
        return False
    try:
        held = _number(x509.load_pem_x509_crl((directory / CRL).read_bytes()))
    except (OSError, ValueError):
        held = -1
    if _number(crl) <= held:
        return False
    _write(directory / CRL, crl.public_bytes(serialization.Encoding.PEM))
    return True


def server_context(directory: Path) -> ssl.SSLContext:
    """A worker's door: its certificate; a client's must be the leader's."""
    _role(directory, "worker")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(directory / CA_CERT))
    context.verify_mode = ssl.CERT_REQUIRED  # OpenSSL checks the client's clientAuth usage
    if (directory / CRL).is_file():  # the leader's list: a certificate the leader had before opens nothing
        context.load_verify_locations(cafile=str(directory / CRL))
        context.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    context.load_cert_chain(directory / CERT, directory / KEY)
    return context


def client_context(directory: Path, *, node_checked: bool = True) -> ssl.SSLContext:
    """The leader: its certificate; a door's must be a worker's (serverAuth)
    of the CA, not revoked (the CA's list, checked by OpenSSL), and name the
    node the leader dials (node_name, given as the server name: the leader
    reaches doors by address). `node_checked=False`: any worker's (tests)."""
    _role(directory, "leader")
    if not (directory / CRL).is_file():
        raise ConfigError(f"no revocation list {directory / CRL}: install.sh --swarm leader (again) writes it")
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(directory / CA_CERT))
    context.load_verify_locations(cafile=str(directory / CRL))
    context.verify_flags |= ssl.VERIFY_CRL_CHECK_LEAF
    context.check_hostname = node_checked
    context.load_cert_chain(directory / CERT, directory / KEY)
    return context


def context_or_exit(role: str, directory: Path) -> ssl.SSLContext:
    """The agent's start: the leader's or the worker's context, or an exit saying why not."""
    try:
        context = server_context(directory) if role == "worker" else client_context(directory)
    except (ConfigError, OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise SystemExit(f"GPUHOST_SWARM={role}: {exc}") from None
    if problem := expiry_problem(directory):
        log.warning("swarm_certificate_expiring", problem=problem, hint=RENEWAL[role])
    return context


def doctor_check(role: str, directory: Path) -> dict:
    """Doctor's watch on this machine's Swarm certificate (a check's wire shape)."""
    try:
        problem = expiry_problem(directory)
    except (OSError, ValueError) as exc:
        problem = f"this machine's Swarm certificate cannot be read ({exc})"
    summary = problem or f"this machine's Swarm certificate is valid until {expires(directory):%Y-%m-%d}"
    remedy = RENEWAL[role] if problem else ""
    return {"id": "swarm-certificate", "ok": problem is None, "skipped": False, "summary": summary, "remedy": remedy}


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


def _builder(
    subject: x509.Name, issuer: x509.Name, public: ec.EllipticCurvePublicKey, *, days: int
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def _ca(directory: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """The environment CA's key and certificate (on the leader's machine alone)."""
    ca_key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    return ca_key, x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())


def _records(path: Path) -> dict[str, str]:
    """{serial (hex): node} of the CA's issued or revoked certificates."""
    try:
        found = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    if not isinstance(found, dict):
        raise ConfigError(f"{path} is not the CA's record of certificates")
    return {str(serial): str(node) for serial, node in found.items()}


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
    """Written whole then renamed; 0600 for a key, 0644 for a certificate. The
    temporary file is a new one of a random name (mkstemp: O_EXCL), never one a
    local user could have planted in a shared folder."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), 0o600 if secret else 0o644)
            out.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def main(argv: list[str]) -> int:
    try:
        if argv[:1] == ["leader"] and len(argv) == 2:
            install_leader(Path(argv[1]))
        elif argv[:1] == ["bundle"] and len(argv) == 4:
            _write(Path(argv[2]), bundle(Path(argv[1]), argv[3]), secret=True)
        elif argv[:1] == ["worker"] and len(argv) in (3, 4):
            install_worker(Path(argv[1]), Path(argv[2]), argv[3] if len(argv) == 4 else None)
        elif argv[:1] == ["revoke"] and len(argv) == 3:
            print(" ".join(revoke(Path(argv[1]), argv[2])))
        else:
            usage = "leader DIR | bundle DIR OUT NODE_ID | worker BUNDLE DIR [NODE_ID] | revoke DIR NODE_ID"
            print(f"usage: swarm_tls {usage}", file=sys.stderr)
            return 2
    except (ConfigError, OSError, ValueError, TypeError) as exc:
        print(f"Swarm TLS: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
