"""Basic auth for the `http` tunnels of a stack whose template asks for it
(`isBasicAuthEnabled`), enforced by the marketplace before any byte reaches
the host.

Credentials per stack: the user `renter` and a password derived from the
marketplace's secret and the stack id (HMAC), so the renter's tunnel info can
show it again without the marketplace keeping it; what the stack record keeps
is a salted PBKDF2 hash, and a login is checked against that hash, in
constant time.

A sign-in link (`?gpuhost_token=`) lets a browser and its WebSockets in
without a password prompt. The link is not a standing credential:
each tunnel-info read mints a new one, good for one use within LINK_SECONDS,
signed with a key this gate holds in memory only (a token from before a
marketplace restart or from another tunnel means nothing). Its first use
marks it used and answers with a redirect that sets a separate session
cookie, a random value the gate knows by its digest, good for
SESSION_SECONDS; a second use of the link is refused with a page that says
so. A new stack password (POST .../tunnel-password) replaces the gate, so
every session and unused link of the stack's tunnels ends with it. Used
links are remembered until they expire (at most MAX_USED_LINKS per tunnel,
past that a link is refused as used) and sessions are bounded too
(MAX_SESSIONS per tunnel, the oldest dropped first).

Checking a password is PBKDF2, tens of milliseconds of CPU: it runs on
threads of its own (HASH_THREADS, so a flood of logins can neither stall the
event loop, which serves every tunnel and the agents, nor take the default
executor's threads), with at most HASH_WAITING checks waiting for one; past
that the answer is 503 with Retry-After, counted as nobody's failure. A
password that passed once is known by a keyed digest from then on, so the
renter's further requests (each on a new connection, see below) are checked
without a hash. Failures are remembered per (credential, client address): the
same wrong user and password from the same address is answered without
hashing again, and with 429 past MAX_FAILURES in FAILURE_WINDOW. A
credential never tried is always checked, so nobody behind the same address,
with any other user name or password, can lock the renter out; guessing is
held back by the hash threads alone, against a password of 144 bits.

A session is a bearer credential scoped to ONE tunnel: its cookie is named
after the tunnel (`gpuhost_tunnel_<tunnelId>`, so two tunnels' sessions never
overwrite each other in a browser), the gate
knows it by a digest of the tunnel id and the value (a session of tunnel A is
never accepted by tunnel B, even under B's name), and every `http` tunnel,
with or without basic auth, strips every `gpuhost_tunnel*` cookie from what
it forwards. That matters because cookies do not separate ports (RFC 6265
section 8.5) and every tunnel is 127.0.0.1:<port>: a browser sends each
tunnel's session to every other tunnel of the host, and no container, the
renter's own or another rental's, may ever see one. A session is not bound
to the client's address: the listeners are on loopback, where every client
is 127.0.0.1 (a binding would hold nobody back), and behind a proxy or a
mobile network a renter's address changes while the browser is the same.
What protects a session is that it never leaves the browser but to its own
tunnel's gate (HttpOnly, stripped before any container), lives
SESSION_SECONDS at most and ends with a new password.

Every request of a connection is read and judged (tunnel_requests.py), and
ours are stripped from each (our Authorization header when the tunnel has
basic auth, our cookies always); an HTTP/1.0 request is sent with
`Connection: close`, so a further one comes on a new connection. After an
upgrade the rest of the connection is the plain byte relay. Without basic
auth a service's own `Authorization` headers pass untouched.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import re
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from gpuhost_agent.local_marketplace.http_errors import same_secret

USERNAME = "renter"
COOKIE_PREFIX = "gpuhost_tunnel"  # every cookie whose name starts so is ours, stripped by every http tunnel
TOKEN_PARAM = "gpuhost_token"
MAX_FAILURES = 10  # per tunnel, credential and client address, within FAILURE_WINDOW
FAILURE_WINDOW = 60.0
MAX_REMEMBERED = 4096  # failures remembered per tunnel; the oldest are forgotten first
PBKDF2_ROUNDS = 100_000
HASH_THREADS = 2  # password checks at once, for every tunnel together
HASH_WAITING = 64  # checks waiting for a thread; past that, 503 and Retry-After
# A fair share: one tunnel's gate has at most this many checks waiting, and its
# first is always taken, so wrong passwords flooding one tunnel (the attacker's
# own) never make another renter's first login a 503.
GATE_WAITING = 4
BUSY_RETRY_SECONDS = 1
LINK_SECONDS = 300  # a sign-in link's life
SESSION_SECONDS = 12 * 3600  # a session cookie's life, from its link's use
MAX_USED_LINKS = 4096  # per tunnel; links live LINK_SECONDS, so only a flood of reads fills it
MAX_SESSIONS = 256  # per tunnel; the oldest session goes first
LINK_REFUSED = (
    "This sign-in link was already used or has expired: a link signs in once, within 5 minutes. "
    "Read the tunnel info again for a new link, or log in with the stack's user and password."
)


def cookie_name(tunnel_id: str) -> str:
    """The session cookie of one tunnel: a name of its own as well as a host
    of its own (host_name)."""
    return f"{COOKIE_PREFIX}_{tunnel_id}"


def host_name(tunnel_id: str) -> str:
    """The name a basic-auth tunnel is reached by in a browser, and its
    session cookie kept under: `<tunnel id>.localhost`, which browsers resolve
    to the loopback themselves. Cookies ignore ports, and every tunnel is
    127.0.0.1:<port>: under one name, a tunnel's session went with the
    browser's requests to every other tunnel of the host, a `tcp` one of
    another rental's too, which reads no request to strip it from. Under a
    name of its own (host-only, SameSite=Strict) it goes to its own tunnel
    alone; the id is unguessable, and another tunnel's service can set no
    cookie for it (`localhost` is a public suffix to browsers)."""
    return f"{tunnel_id}.localhost"


def _mac(secret: str, purpose: str, subject: str) -> str:
    digest = hmac.new(secret.encode(), f"{purpose}:{subject}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def password(secret: str, stack_id: str, generation: int = 0) -> str:
    """The stack's password; a new `generation` (POST .../tunnel-password) is a new password."""
    subject = stack_id if not generation else f"{stack_id}#{generation}"
    return _mac(secret, "basic", subject)[:24]


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
        if not sep or not name or name != name.strip():  # no space before the colon, no folded line (RFC 9112 5.1)
            return None
        headers.append((name, value.strip()))
    return Head(method, target, version, headers)


@dataclass
class Decision:
    """`forward` (the head to send on), or a response of ours to send instead."""

    forward: Head | None = None
    status: int = 0
    headers: list[tuple[str, str]] = field(default_factory=list)
    text: str = ""
    go_to: str = ""  # a path of this tunnel the answer's page goes on to (the sign-in's)


class _Hasher:
    """PBKDF2 checks on threads of their own, a bounded number waiting, each
    gate its fair share (GATE_WAITING)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self.waiting = 0  # checks asked for and not answered, on the event loop's thread
        self.per_gate: dict[str, int] = {}  # the same, by gate (tunnel id); a gate with none is not kept

    async def verify(self, stored: str, plain: str, gate: str = "") -> bool | None:
        """Whether `plain` matches; None when too many checks wait already: the
        gate's share, or every gate's once the gate has one waiting."""
        mine = self.per_gate.get(gate, 0)
        full = self.waiting >= HASH_THREADS + HASH_WAITING
        if (full and (mine or not gate)) or (gate and mine >= GATE_WAITING):  # no gate named: the bound alone
            return None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="tunnel-auth")
        self.waiting += 1
        self.per_gate[gate] = mine + 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, verify_password, stored, plain)
        finally:
            self.waiting -= 1
            left = self.per_gate.pop(gate, 1) - 1
            if left:
                self.per_gate[gate] = left


HASHER = _Hasher()
_DIGEST_KEY = secrets.token_bytes(32)  # this process's: a credential's digest means nothing elsewhere


def _digest(user: str, given: str) -> bytes:
    return hmac.new(_DIGEST_KEY, f"{user}\0{given}".encode("utf-8", "surrogatepass"), hashlib.sha256).digest()


class Gate:
    """One tunnel's door: which first requests go through."""

    def __init__(self, password_hash: str, tunnel_id: str, hasher: _Hasher = HASHER):
        self.password_hash, self.tunnel_id, self._hasher = password_hash, tunnel_id, hasher
        self.realm, self.cookie = f"tunnel {tunnel_id}", cookie_name(tunnel_id)
        self._failures: dict[tuple[str, bytes], list[float]] = {}  # (address, credential digest): when
        self._passed: bytes | None = None  # the digest of the credential that passed PBKDF2
        self._link_key = secrets.token_bytes(32)  # this gate's alone: its links mean nothing elsewhere
        self._used: dict[str, float] = {}  # a used link's nonce: when it expires
        self._sessions: dict[bytes, float] = {}  # a session cookie's digest: when it expires

    def new_link(self, now: float | None = None) -> tuple[str, float]:
        """A one-time sign-in token and the monotonic time it expires."""
        expires = (time.monotonic() if now is None else now) + LINK_SECONDS
        body = f"{expires:.3f}.{secrets.token_urlsafe(12)}"
        return f"{body}.{self._sign(body)}", expires

    def _sign(self, body: str) -> str:
        digest = hmac.new(self._link_key, body.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")[:32]

    def _use_link(self, token: str, now: float) -> bool:
        """Whether `token` is this gate's, unexpired and unused; if so, it is used now."""
        body, _, signature = token.rpartition(".")
        expires_text, _, nonce = body.partition(".")
        if not (nonce and same_secret(signature, self._sign(body))):
            return False
        try:
            expires = float(expires_text)
        except ValueError:
            return False
        self._used = {n: t for n, t in self._used.items() if t > now}
        if expires <= now or nonce in self._used or len(self._used) >= MAX_USED_LINKS:
            return False
        self._used[nonce] = expires
        return True

    def _new_session(self, now: float) -> str:
        session = secrets.token_urlsafe(32)
        self._sessions = {d: t for d, t in self._sessions.items() if t > now}
        while len(self._sessions) >= MAX_SESSIONS:
            self._sessions.pop(next(iter(self._sessions)))
        self._sessions[_session_digest(self.tunnel_id, session)] = now + SESSION_SECONDS
        return session

    async def decide(self, head: Head, client: str, now: float | None = None) -> Decision:
        now = time.monotonic() if now is None else now
        try:
            split = urlsplit(head.target)
            query = parse_qsl(split.query, keep_blank_values=True)
        except ValueError:  # a target urllib cannot split (`//[`): no service gets it either
            return Decision(status=400, text="not a request target this tunnel passes on")
        token = next((value for key, value in query if key == TOKEN_PARAM), None)
        if token is not None:
            if not self._use_link(token, now):
                return Decision(status=403, text=LINK_REFUSED)
            kept = urlunsplit(
                ("", "", local_path(split.path), urlencode([(k, v) for k, v in query if k != TOKEN_PARAM]), "")
            )
            cookie = f"{self.cookie}={self._new_session(now)}; Path=/; HttpOnly; SameSite=Strict"
            # A page that goes on by itself, not a redirect: after a navigation from another
            # site (the link in the marketplace's page) a redirect is that site's still, and
            # the browser would not send the Strict cookie with it.
            return Decision(status=200, headers=[("Set-Cookie", cookie)], text="signed in", go_to=kept)
        if self._cookie_ok(head, now):
            return Decision(forward=stripped(head, basic=True))
        credential = _basic(head)
        if credential is None:
            return self._challenge()
        user, given = credential
        digest = _digest(user, given)
        if self._passed is not None and hmac.compare_digest(digest, self._passed):
            return Decision(forward=stripped(head, basic=True))
        key = (client, digest)
        recent = [t for t in self._failures.pop(key, []) if now - t < FAILURE_WINDOW]
        if len(recent) >= MAX_FAILURES:
            self._remember(key, recent)
            wait = int(FAILURE_WINDOW - (now - recent[0])) + 1
            return Decision(status=429, headers=[("Retry-After", str(wait))], text="too many failed logins")
        if not recent and same_secret(user, USERNAME):  # a credential not yet found wrong: hash it
            ok = await self._hasher.verify(self.password_hash, given, self.tunnel_id)
            if ok is None:  # nobody's failure: the credential was not checked
                busy = [("Retry-After", str(BUSY_RETRY_SECONDS))]
                return Decision(status=503, headers=busy, text="too many logins at once; try again")
            if ok:
                self._passed = digest
                return Decision(forward=stripped(head, basic=True))
        self._remember(key, [*recent, now])
        return self._challenge()

    def _challenge(self) -> Decision:
        return Decision(
            status=401, headers=[("WWW-Authenticate", f'Basic realm="{self.realm}"')], text="log in to this tunnel"
        )

    def _remember(self, key: tuple[str, bytes], times: list[float]) -> None:
        self._failures[key] = times  # last in order: the oldest entries are forgotten first
        while len(self._failures) > MAX_REMEMBERED:
            self._failures.pop(next(iter(self._failures)))

    def _cookie_ok(self, head: Head, now: float) -> bool:
        for key, value in head.headers:
            if key.lower() == "cookie":
                for part in value.split(";"):
                    name, _, given = part.strip().partition("=")
                    if name == self.cookie and self._sessions.get(_session_digest(self.tunnel_id, given), 0.0) > now:
                        return True
        return False


def _session_digest(tunnel_id: str, session: str) -> bytes:
    """What the gate keeps of a session cookie: looked up by digest, so no
    comparison of the secret itself can leak its bytes by timing; the tunnel
    id is in it, so a session is its tunnel's alone."""
    return hashlib.sha256(f"{tunnel_id}\0{session}".encode("utf-8", "surrogatepass")).digest()


_UNSAFE = re.compile(r"[\x00-\x20\x7f]")


def local_path(path: str) -> str:
    """The sign-in redirect's target: a path on this same tunnel. Browsers
    read `//host`, `/\\host` (and either with tabs or newlines between) as
    another site, so the leading slashes and backslashes become one `/`;
    control characters and spaces go (nor can they split our headers)."""
    return "/" + _UNSAFE.sub("", path).lstrip("/\\")


def _basic(head: Head) -> tuple[str, str] | None:
    """The user and password of a Basic Authorization header, or None."""
    value = head.get("Authorization") or ""
    scheme, _, encoded = value.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, _, given = base64.b64decode(encoded.strip(), validate=True).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return None
    return user, given


def stripped(head: Head, *, basic: bool) -> Head:
    """The head to forward: our cookies (every `gpuhost_tunnel*`, any
    tunnel's) out, our Basic Authorization out when the tunnel has basic
    auth (`basic`), and `Connection: close` on a request that is not HTTP/1.1
    (tunnel_requests.py reads HTTP/1.1's next requests, no other's)."""
    headers = []
    for key, value in head.headers:
        if basic and key.lower() == "authorization" and value.lower().startswith("basic "):
            continue
        if key.lower() == "cookie":
            parts = [p for p in value.split(";") if not p.strip().startswith(COOKIE_PREFIX)]
            if not [p for p in parts if p.strip()]:
                continue
            value = ";".join(parts).strip()
        headers.append((key, value))
    if head.version != "HTTP/1.1":
        headers = [(k, v) for k, v in headers if k.lower() not in ("connection", "keep-alive")]
        headers.append(("Connection", "close"))
    return Head(head.method, head.target, head.version, headers)
