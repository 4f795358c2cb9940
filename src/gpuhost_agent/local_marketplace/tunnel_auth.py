"""Basic auth for the `http` tunnels of a stack whose template asks for it
(`isBasicAuthEnabled`), enforced by the marketplace before any byte reaches
the host.

Credentials per stack: the user `renter` and a password derived from the
marketplace's secret and the stack id (HMAC), so the renter's tunnel info can
show it again without the marketplace keeping it; what the stack record keeps
is a salted PBKDF2 hash, and a login is checked against that hash, in
constant time. A token link (`?gpuhost_token=`, also derived) sets a cookie
for the tunnel and redirects to the same path without it, so a browser and
its WebSockets work without a password prompt. Failed logins are limited per
tunnel and client address.

Only the first request of a connection is read: ours are stripped from it
(our Authorization header, our cookie) and, unless it is an upgrade, it is
sent with `Connection: close`, so every further request comes on a new
connection and is checked again; the rest of the connection is the plain byte
relay. Without basic auth nothing is read at all, and a service's own
`Authorization` headers pass untouched.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from gpuhost_agent.local_marketplace.http_errors import same_secret

USERNAME = "renter"
COOKIE = "gpuhost_tunnel"
TOKEN_PARAM = "gpuhost_token"
MAX_FAILURES = 10  # per tunnel and client address, within FAILURE_WINDOW
FAILURE_WINDOW = 60.0
PBKDF2_ROUNDS = 100_000


def _mac(secret: str, purpose: str, subject: str) -> str:
    digest = hmac.new(secret.encode(), f"{purpose}:{subject}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def password(secret: str, stack_id: str) -> str:
    return _mac(secret, "basic", stack_id)[:24]


def link_token(secret: str, tunnel_id: str) -> str:
    return _mac(secret, "link", tunnel_id)[:32]


def hash_password(plain: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", plain.encode(), salt, PBKDF2_ROUNDS)
    return f"pbkdf2-sha256${PBKDF2_ROUNDS}${salt.hex()}${digest.hex()}"


def verify_password(stored: str, plain: str) -> bool:
    try:
        _scheme, rounds, salt, digest = stored.split("$")
        given = hashlib.pbkdf2_hmac("sha256", plain.encode(), bytes.fromhex(salt), int(rounds))
    except ValueError:
        return False
    return hmac.compare_digest(given.hex(), digest)


@dataclass
class Head:
    """A request's first line and headers, as sent (names keep their case)."""

    method: str
    target: str
    version: str
    headers: list[tuple[str, str]]

    def get(self, name: str) -> str | None:
        return next((value for key, value in self.headers if key.lower() == name.lower()), None)

    def render(self) -> bytes:
        lines = [f"{self.method} {self.target} {self.version}", *(f"{k}: {v}" for k, v in self.headers)]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def parse_head(raw: bytes) -> Head | None:
    try:
        text = raw.decode("latin-1")
        first, *rest = text.rstrip("\r\n").split("\r\n")
        method, target, version = first.split(" ")
    except ValueError:
        return None
    headers = []
    for line in rest:
        name, sep, value = line.partition(":")
        if not sep or not name.strip():
            return None
        headers.append((name.strip(), value.strip()))
    return Head(method, target, version, headers)


@dataclass
class Decision:
    """`forward` (the head to send on), or a response of ours to send instead."""

    forward: Head | None = None
    status: int = 0
    headers: list[tuple[str, str]] = field(default_factory=list)
    text: str = ""


class Gate:
    """One tunnel's door: which first requests go through."""

    def __init__(self, password_hash: str, link: str, realm: str):
        self.password_hash, self.link, self.realm = password_hash, link, realm
        self._failures: dict[str, list[float]] = {}

    def decide(self, head: Head, client: str, now: float | None = None) -> Decision:
        now = time.monotonic() if now is None else now
        recent = [t for t in self._failures.get(client, []) if now - t < FAILURE_WINDOW]
        self._failures[client] = recent
        if len(recent) >= MAX_FAILURES:
            wait = int(FAILURE_WINDOW - (now - recent[0])) + 1
            return Decision(status=429, headers=[("Retry-After", str(wait))], text="too many failed logins")
        split = urlsplit(head.target)
        query = parse_qsl(split.query, keep_blank_values=True)
        token = next((value for key, value in query if key == TOKEN_PARAM), None)
        if same_secret(token, self.link):
            kept = urlunsplit(
                ("", "", split.path or "/", urlencode([(k, v) for k, v in query if k != TOKEN_PARAM]), "")
            )
            cookie = f"{COOKIE}={self.link}; Path=/; HttpOnly; SameSite=Lax"
            return Decision(status=302, headers=[("Location", kept), ("Set-Cookie", cookie)], text="signed in")
        if self._cookie_ok(head) or self._basic_ok(head):
            return Decision(forward=_stripped(head))
        recent.append(now)
        return Decision(
            status=401, headers=[("WWW-Authenticate", f'Basic realm="{self.realm}"')], text="log in to this tunnel"
        )

    def _cookie_ok(self, head: Head) -> bool:
        for key, value in head.headers:
            if key.lower() == "cookie":
                for part in value.split(";"):
                    name, _, given = part.strip().partition("=")
                    if name == COOKIE and same_secret(given, self.link):
                        return True
        return False

    def _basic_ok(self, head: Head) -> bool:
        value = head.get("Authorization") or ""
        scheme, _, encoded = value.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, _, given = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        return same_secret(user, USERNAME) & verify_password(self.password_hash, given)


def _stripped(head: Head) -> Head:
    """Our credentials out; `Connection: close` unless it is an upgrade."""
    headers = []
    for key, value in head.headers:
        if key.lower() == "authorization" and value.lower().startswith("basic "):
            continue
        if key.lower() == "cookie":
            parts = [p for p in value.split(";") if p.strip().partition("=")[0] != COOKIE]
            if not [p for p in parts if p.strip()]:
                continue
            value = ";".join(parts).strip()
        headers.append((key, value))
    if head.get("Upgrade") is None:
        headers = [(k, v) for k, v in headers if k.lower() not in ("connection", "keep-alive")]
        headers.append(("Connection", "close"))
    return Head(head.method, head.target, head.version, headers)
