"""Basic auth of http tunnels, without a network: credentials, and which first
requests the gate lets through, stripped of ours. Through the real relay, with
the event loop's lag measured: tests/integration/test_tunnel_auth_engine.py."""

from __future__ import annotations

import asyncio
import base64
import threading
import time

from support.loop_lag import LoopLag

from gpuhost_agent.local_marketplace.tunnels import auth as tunnel_auth
from gpuhost_agent.local_marketplace.tunnels.auth import Gate, Head, cookie_name, parse_head

COOKIE = cookie_name("t1")

SECRET = "marketplace-secret"


def _gate(hasher: tunnel_auth._Hasher = tunnel_auth.HASHER) -> Gate:
    plain = tunnel_auth.password(SECRET, "stack-1")
    return Gate(tunnel_auth.hash_password(plain), "t1", hasher)


class CountingHasher(tunnel_auth._Hasher):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def verify(self, stored: str, plain: str, gate: str = "") -> bool | None:
        self.calls += 1
        return await super().verify(stored, plain, gate)


def _head(*headers: tuple[str, str], target: str = "/app?x=1") -> Head:
    return Head("GET", target, "HTTP/1.1", [("Host", "127.0.0.1"), *headers])


def _basic(user: str, password: str) -> tuple[str, str]:
    return "Authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_credentials_are_derived_and_only_a_hash_is_kept() -> None:
    assert tunnel_auth.password(SECRET, "stack-1") == tunnel_auth.password(SECRET, "stack-1")
    assert tunnel_auth.password(SECRET, "stack-1") != tunnel_auth.password(SECRET, "stack-2")
    assert tunnel_auth.password("other-secret", "stack-1") != tunnel_auth.password(SECRET, "stack-1")
    stored = tunnel_auth.hash_password("pw")
    assert "pw" not in stored and stored != tunnel_auth.hash_password("pw")  # salted
    assert tunnel_auth.verify_password(stored, "pw") and not tunnel_auth.verify_password(stored, "pW")
    assert not tunnel_auth.verify_password("garbage", "pw")


async def test_no_or_wrong_credentials_are_challenged() -> None:
    gate = _gate()
    for head in (
        _head(),
        _head(_basic("renter", "wrong")),
        _head(_basic("admin", tunnel_auth.password(SECRET, "stack-1"))),
    ):
        decision = await gate.decide(head, "10.0.0.1", now=0.0)
        assert decision.forward is None and decision.status == 401
        assert ("WWW-Authenticate", 'Basic realm="tunnel t1"') in decision.headers


async def test_the_right_password_goes_through_without_our_header_and_keeps_http11_alive() -> None:
    head = _head(_basic("renter", tunnel_auth.password(SECRET, "stack-1")), ("Connection", "keep-alive"))
    decision = await _gate().decide(head, "10.0.0.1", now=0.0)
    assert decision.forward is not None
    assert decision.forward.get("Authorization") is None and decision.forward.get("Connection") == "keep-alive"
    assert decision.forward.target == "/app?x=1"
    # HTTP/1.0's keep-alive is not read request by request: its connection closes after one
    old = tunnel_auth.Head(head.method, head.target, "HTTP/1.0", head.headers)
    decision = await _gate().decide(old, "10.0.0.1", now=0.0)
    assert decision.forward is not None and decision.forward.get("Connection") == "close"


async def test_a_websocket_upgrade_keeps_its_connection_header() -> None:
    head = _head(
        _basic("renter", tunnel_auth.password(SECRET, "stack-1")), ("Connection", "Upgrade"), ("Upgrade", "websocket")
    )
    forward = (await _gate().decide(head, "10.0.0.1", now=0.0)).forward
    assert forward is not None and forward.get("Connection") == "Upgrade" and forward.get("Upgrade") == "websocket"


def _set_cookie(decision: tunnel_auth.Decision) -> str:
    value = dict(decision.headers)["Set-Cookie"]
    assert value.endswith("; Path=/; HttpOnly; SameSite=Strict"), value
    return value.split(";")[0]


async def test_the_link_signs_in_once_with_a_session_cookie_of_its_own() -> None:
    gate = _gate()
    link, _expires = gate.new_link(now=0.0)
    decision = await gate.decide(_head(target=f"/lab?{tunnel_auth.TOKEN_PARAM}={link}&tab=2"), "10.0.0.1", now=1.0)
    assert decision.status == 200 and decision.go_to == "/lab?tab=2"  # a page that goes on, not a redirect
    cookie = _set_cookie(decision)
    assert cookie.startswith(f"{COOKIE}=") and link not in cookie, "the session is not the link's token"
    again = await gate.decide(_head(target=f"/lab?{tunnel_auth.TOKEN_PARAM}={link}"), "10.0.0.1", now=2.0)
    assert again.status == 403 and "already used" in again.text
    wrong = await gate.decide(_head(target=f"/lab?{tunnel_auth.TOKEN_PARAM}=nope"), "10.0.0.1", now=2.0)
    assert wrong.status == 403
    forward = (await gate.decide(_head(("Cookie", f"theme=dark; {cookie}")), "10.0.0.1", now=3.0)).forward
    assert forward is not None and forward.get("Cookie") == "theme=dark"
    only_ours = (await gate.decide(_head(("Cookie", cookie)), "10.0.0.1", now=3.0)).forward
    assert only_ours is not None and only_ours.get("Cookie") is None
    link_as_cookie = await gate.decide(_head(("Cookie", f"{COOKIE}={link}")), "10.0.0.1", now=3.0)
    assert link_as_cookie.status == 401, "the link's token is no cookie"
    late = await gate.decide(_head(("Cookie", cookie)), "10.0.0.1", now=tunnel_auth.SESSION_SECONDS + 2.0)
    assert late.status == 401, "a session ends"


async def test_a_link_expires_and_belongs_to_its_gate_alone() -> None:
    gate, other = _gate(), _gate()
    link, expires = gate.new_link(now=0.0)
    assert expires == tunnel_auth.LINK_SECONDS
    elsewhere = await other.decide(_head(target=f"/?{tunnel_auth.TOKEN_PARAM}={link}"), "10.0.0.1", now=1.0)
    assert elsewhere.status == 403, "another tunnel's (or another marketplace run's) gate does not know it"
    late = await gate.decide(_head(target=f"/?{tunnel_auth.TOKEN_PARAM}={link}"), "10.0.0.1", now=expires + 1)
    assert late.status == 403
    forged = link.rsplit(".", 1)[0].replace(link.split(".")[0], str(10**9)) + "." + link.rsplit(".", 1)[1]
    assert (await gate.decide(_head(target=f"/?{tunnel_auth.TOKEN_PARAM}={forged}"), "10.0.0.1", now=1.0)).status == 403
    fresh, _ = gate.new_link(now=expires + 1)
    decision = await gate.decide(_head(target=f"/?{tunnel_auth.TOKEN_PARAM}={fresh}"), "10.0.0.1", now=expires + 2)
    assert decision.status == 200 and decision.go_to == "/"


def test_a_new_generation_is_a_new_password() -> None:
    assert tunnel_auth.password(SECRET, "stack-1", 0) == tunnel_auth.password(SECRET, "stack-1")
    assert tunnel_auth.password(SECRET, "stack-1", 1) != tunnel_auth.password(SECRET, "stack-1")


async def test_the_same_wrong_credential_is_limited_per_address_and_not_hashed_again() -> None:
    hasher = CountingHasher()
    gate = _gate(hasher)
    for second in range(tunnel_auth.MAX_FAILURES):
        assert (await gate.decide(_head(_basic("renter", "x")), "10.0.0.1", now=float(second))).status == 401
    assert hasher.calls == 1  # known wrong after the first check
    limited = await gate.decide(_head(_basic("renter", "x")), "10.0.0.1", now=10.0)
    assert limited.status == 429 and limited.headers[0][0] == "Retry-After"
    assert (await gate.decide(_head(_basic("renter", "x")), "10.0.0.2", now=10.0)).status == 401  # another address
    assert (await gate.decide(_head(_basic("renter", "x")), "10.0.0.1", now=100.0)).status == 401  # the window passed
    assert hasher.calls == 3  # the other address, and the same one once the window passed


async def test_a_correct_login_is_never_locked_out_by_others_at_the_same_address() -> None:
    """The case that matters: everyone behind one NAT address shares it; a flood of
    wrong logins from there, with other user names and other passwords, and
    the renter's own password still goes through."""
    gate, right = _gate(), tunnel_auth.password(SECRET, "stack-1")
    for attempt in range(3 * tunnel_auth.MAX_FAILURES):
        for user, password in (("renter", f"guess-{attempt}"), (f"admin{attempt}", right), ("renter", "same")):
            decision = await gate.decide(_head(_basic(user, password)), "203.0.113.7", now=float(attempt))
            assert decision.status in (401, 429)
    decision = await gate.decide(_head(_basic("renter", right)), "203.0.113.7", now=31.0)
    assert decision.forward is not None
    link, _ = gate.new_link()
    assert (await gate.decide(_head(target=f"/?{tunnel_auth.TOKEN_PARAM}={link}"), "203.0.113.7")).go_to == "/"


async def test_a_password_that_passed_is_not_hashed_again() -> None:
    hasher = CountingHasher()
    gate, right = _gate(hasher), tunnel_auth.password(SECRET, "stack-1")
    for _ in range(5):
        assert (await gate.decide(_head(_basic("renter", right)), "10.0.0.1")).forward is not None
    assert hasher.calls == 1
    assert (await gate.decide(_head(_basic("renter", right + "x")), "10.0.0.1")).status == 401


async def test_checks_past_the_waiting_bound_are_told_to_retry_and_count_as_no_failure() -> None:
    gate, right = _gate(), tunnel_auth.password(SECRET, "stack-1")
    tunnel_auth.HASHER.waiting += tunnel_auth.HASH_THREADS + tunnel_auth.HASH_WAITING  # a flood in progress
    tunnel_auth.HASHER.per_gate[gate.tunnel_id] = 1  # this gate's among it
    try:
        busy = await gate.decide(_head(_basic("renter", right)), "10.0.0.1")
    finally:
        tunnel_auth.HASHER.waiting -= tunnel_auth.HASH_THREADS + tunnel_auth.HASH_WAITING
        del tunnel_auth.HASHER.per_gate[gate.tunnel_id]
    assert busy.status == 503 and ("Retry-After", "1") in busy.headers
    assert (await gate.decide(_head(_basic("renter", right)), "10.0.0.1")).forward is not None


async def test_a_flood_of_wrong_passwords_at_one_tunnel_leaves_another_tunnels_login_its_check() -> None:
    """66 wrong passwords in flight at the attacker's own tunnel made another renter's first
    correct login a 503: each gate has its fair share, and its first check is taken."""
    stored = tunnel_auth.hash_password("attackers-own")
    real = tunnel_auth.verify_password
    release = threading.Event()

    def held(stored: str, plain: str) -> bool:
        release.wait(10)  # the flood's checks stay in flight while the victim logs in
        return real(stored, plain)

    tunnel_auth.verify_password = held  # type: ignore[assignment]
    flood = [asyncio.ensure_future(tunnel_auth.HASHER.verify(stored, f"x{i}", "attackers")) for i in range(66)]
    try:
        await asyncio.sleep(0.05)
        assert tunnel_auth.HASHER.per_gate["attackers"] == tunnel_auth.GATE_WAITING  # its share, the rest refused
        tunnel_auth.HASHER.waiting += tunnel_auth.HASH_WAITING  # and every other slot taken too
        victim, right = _gate(), tunnel_auth.password(SECRET, "stack-1")
        tunnel_auth.verify_password = real  # type: ignore[assignment]
        login = asyncio.ensure_future(victim.decide(_head(_basic("renter", right)), "10.0.0.2"))
        await asyncio.sleep(0.05)
        tunnel_auth.HASHER.waiting -= tunnel_auth.HASH_WAITING
        release.set()
        assert (await login).forward is not None
    finally:
        release.set()
        tunnel_auth.verify_password = real  # type: ignore[assignment]
        await asyncio.gather(*flood)


async def test_the_hash_runs_off_the_event_loop_on_bounded_threads() -> None:
    stored = tunnel_auth.hash_password("pw")
    threads: set[str] = set()
    real = tunnel_auth.verify_password

    def watched(stored: str, plain: str) -> bool:
        threads.add(threading.current_thread().name)
        return real(stored, plain)

    started = time.monotonic()
    real(stored, "x")
    one = time.monotonic() - started  # one check, on this machine now
    tunnel_auth.verify_password = watched  # type: ignore[assignment]
    try:
        lag = LoopLag()
        async with lag:
            results = await asyncio.gather(*(tunnel_auth.HASHER.verify(stored, f"x{i}") for i in range(12)))
    finally:
        tunnel_auth.verify_password = real  # type: ignore[assignment]
    assert results == [False] * 12
    assert threading.main_thread().name not in threads
    assert 1 <= len(threads) <= tunnel_auth.HASH_THREADS, threads
    assert len(lag.gaps) >= 5 and lag.blocked(one / 2) < 0.5, (one, lag.gaps)  # on the loop: near 1, no tick


def test_a_head_parses_and_renders_back() -> None:
    raw = b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\n"
    head = parse_head(raw)
    assert head is not None and head.render() == raw and head.get("content-length") == "3"
    assert parse_head(b"not http\r\n\r\n") is None and parse_head(b"GET / HTTP/1.1\r\nbad header\r\n\r\n") is None


async def test_credentials_that_are_not_ascii_are_wrong_credentials_not_a_crash() -> None:
    """hmac refuses to compare str with non-ASCII characters."""
    gate = _gate()
    for head in (
        _head(target="/app?gpuhost_token=%FF%FE"),
        _head(target="/app?gpuhost_token=caf\xe9"),
        _head(("Cookie", f"{COOKIE}=\xe9\xff")),
        _head(_basic("r\xe9nter", "pw")),
        _head(target="/app?gpuhost_token=1.\xe9.caf\xe9"),
    ):
        assert (await gate.decide(head, "client")).status in (401, 403), head


async def test_the_sign_in_redirect_stays_on_the_tunnel() -> None:
    """`/\\evil.com` and `//evil.com` (tabs between, too) are another site to a
    browser: the redirect goes to one leading `/`, nor can it split our headers."""
    gate = _gate()
    for path, location in [
        ("/\\evil.com", "/evil.com"),
        ("//evil.com/x", "/x"),  # read as a host by urlsplit, dropped
        ("/\\/\tevil.com", "/evil.com"),
        ("/lab\nSet-Cookie:x", "/labSet-Cookie:x"),
        ("", "/"),
    ]:
        link, _expires = gate.new_link(now=0.0)
        decision = await gate.decide(_head(target=f"{path}?{tunnel_auth.TOKEN_PARAM}={link}"), "10.0.0.1", now=1.0)
        assert decision.status == 200 and decision.go_to == location, (path, decision.go_to)
