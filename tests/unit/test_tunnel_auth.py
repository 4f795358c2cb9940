"""Basic auth of http tunnels, without a network: credentials, and which first
requests the gate lets through, stripped of ours."""

from __future__ import annotations

import base64

from gpuhost_agent.local_marketplace import tunnel_auth
from gpuhost_agent.local_marketplace.tunnel_auth import COOKIE, Gate, Head, parse_head

SECRET = "marketplace-secret"


def _gate() -> Gate:
    plain = tunnel_auth.password(SECRET, "stack-1")
    return Gate(tunnel_auth.hash_password(plain), tunnel_auth.link_token(SECRET, "t1"), "tunnel t1")


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


def test_no_or_wrong_credentials_are_challenged() -> None:
    gate = _gate()
    for head in (
        _head(),
        _head(_basic("renter", "wrong")),
        _head(_basic("admin", tunnel_auth.password(SECRET, "stack-1"))),
    ):
        decision = gate.decide(head, "10.0.0.1", now=0.0)
        assert decision.forward is None and decision.status == 401
        assert ("WWW-Authenticate", 'Basic realm="tunnel t1"') in decision.headers


def test_the_right_password_goes_through_without_our_header_and_with_connection_close() -> None:
    head = _head(_basic("renter", tunnel_auth.password(SECRET, "stack-1")), ("Connection", "keep-alive"))
    decision = _gate().decide(head, "10.0.0.1", now=0.0)
    assert decision.forward is not None
    assert decision.forward.get("Authorization") is None and decision.forward.get("Connection") == "close"
    assert decision.forward.target == "/app?x=1"


def test_a_websocket_upgrade_keeps_its_connection_header() -> None:
    head = _head(
        _basic("renter", tunnel_auth.password(SECRET, "stack-1")), ("Connection", "Upgrade"), ("Upgrade", "websocket")
    )
    forward = _gate().decide(head, "10.0.0.1", now=0.0).forward
    assert forward is not None and forward.get("Connection") == "Upgrade" and forward.get("Upgrade") == "websocket"


def test_the_link_sets_a_cookie_and_the_cookie_goes_through_stripped() -> None:
    gate, link = _gate(), tunnel_auth.link_token(SECRET, "t1")
    decision = gate.decide(_head(target=f"/lab?{tunnel_auth.TOKEN_PARAM}={link}&tab=2"), "10.0.0.1", now=0.0)
    assert decision.status == 302 and ("Location", "/lab?tab=2") in decision.headers
    assert ("Set-Cookie", f"{COOKIE}={link}; Path=/; HttpOnly; SameSite=Lax") in decision.headers
    wrong = gate.decide(_head(target=f"/lab?{tunnel_auth.TOKEN_PARAM}=nope"), "10.0.0.1", now=0.0)
    assert wrong.status == 401
    forward = gate.decide(_head(("Cookie", f"theme=dark; {COOKIE}={link}")), "10.0.0.1", now=0.0).forward
    assert forward is not None and forward.get("Cookie") == "theme=dark"
    only_ours = gate.decide(_head(("Cookie", f"{COOKIE}={link}")), "10.0.0.1", now=0.0).forward
    assert only_ours is not None and only_ours.get("Cookie") is None


def test_failed_logins_are_limited_per_address() -> None:
    gate = _gate()
    for second in range(tunnel_auth.MAX_FAILURES):
        assert gate.decide(_head(_basic("renter", "x")), "10.0.0.1", now=float(second)).status == 401
    limited = gate.decide(_head(_basic("renter", tunnel_auth.password(SECRET, "stack-1"))), "10.0.0.1", now=10.0)
    assert limited.status == 429 and limited.headers[0][0] == "Retry-After"
    assert gate.decide(_head(), "10.0.0.2", now=10.0).status == 401  # another address is not locked out
    later = gate.decide(_head(_basic("renter", tunnel_auth.password(SECRET, "stack-1"))), "10.0.0.1", now=100.0)
    assert later.forward is not None  # the window passed


def test_a_head_parses_and_renders_back() -> None:
    raw = b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\n"
    head = parse_head(raw)
    assert head is not None and head.render() == raw and head.get("content-length") == "3"
    assert parse_head(b"not http\r\n\r\n") is None and parse_head(b"GET / HTTP/1.1\r\nbad header\r\n\r\n") is None


def test_credentials_that_are_not_ascii_are_wrong_credentials_not_a_crash() -> None:
    """Issue 17: hmac refuses to compare str with non-ASCII characters."""
    gate = _gate()
    for head in (
        _head(target="/app?gpuhost_token=%FF%FE"),
        _head(target="/app?gpuhost_token=caf\xe9"),
        _head(("Cookie", f"{COOKIE}=\xe9\xff")),
        _head(_basic("r\xe9nter", "pw")),
    ):
        assert gate.decide(head, "client").status == 401, head
