"""Basic auth at the local marketplace's tunnel relay under a burst of wrong
logins, with a real HTTP client and a real stack.

The marketplace runs in this test's event loop, so the loop's lag during the
burst is the relay's: the PBKDF2 checks must run off it. And everyone behind
one address (here 127.0.0.1) trying other user names and passwords must not
lock the renter out: the right password still gets the page."""

from __future__ import annotations

import asyncio
import subprocess
import time

import aiohttp
from support.browser_names import BrowserNames, browser_session
from support.loop_lag import LoopLag
from support.stacks import TEST_IMAGE

from gpuhost_agent.local_marketplace.tunnels import auth as tunnel_auth

WEB = f"""
services:
  web:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "mkdir -p /www && echo behind a password > /www/index.html && exec httpd -f -p 8080 -h /www"]
    expose: ["8080"]
    stop_grace_period: 1s
"""
BURST = 24


async def _get(http: aiohttp.ClientSession, url: str, user: str, password: str) -> tuple[int, str]:
    async with http.get(url, auth=aiohttp.BasicAuth(user, password)) as response:
        return response.status, (await response.text()).strip()


async def test_wrong_logins_neither_block_the_loop_nor_lock_the_renter_out(local_market):
    renter, _parts, _local = local_market
    rental_id, stack_id = await renter.applied(WEB, name="auth", isBasicAuthEnabled=True)
    (web,) = await renter.tunnels(rental_id, stack_id, 1)
    url, password = web["url"], web["auth"]["password"]

    stored = tunnel_auth.hash_password("calibration")
    started = time.monotonic()
    await asyncio.to_thread(tunnel_auth.verify_password, stored, "x")
    one = time.monotonic() - started  # one check, on this machine now

    guesses = [("renter", f"guess-{i}") if i % 2 else (f"admin{i}", password) for i in range(BURST)]
    connector = aiohttp.TCPConnector(force_close=True, limit=0, resolver=BrowserNames())  # <id>.localhost
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as http:
        async with LoopLag() as lag:
            answers = await asyncio.gather(*(_get(http, url, user, guess) for user, guess in guesses))
        assert {status for status, _ in answers} <= {401, 429, 503}, answers
        assert lag.blocked(one / 2) < 0.5, (one, lag.elapsed, sorted(lag.gaps)[-BURST:])

        for user, guess in guesses:  # again: known wrong now, answered without a hash
            assert (await _get(http, url, user, guess))[0] in (401, 429)
        assert await _get(http, url, "renter", password) == (200, "behind a password")
        assert await _get(http, url, "renter", password) == (200, "behind a password")


def _curl(*args: str) -> tuple[int, str]:
    """curl as a renter runs it: (HTTP status, body)."""
    done = subprocess.run(
        ["curl", "-sS", "--max-time", "10", "-o", "-", "-w", "\n%{http_code}", *args],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    )
    body, _, status = done.stdout.rpartition("\n")
    return int(status), body


async def test_the_sign_in_link_works_once_and_a_new_password_revokes_its_session(local_market, tmp_path):
    """The sign-in link was the cookie itself and worked again on
    reuse. With curl's cookie jar and with aiohttp's: the link signs in once
    (a session cookie of its own), a second use is refused with a page that
    says so, and a new password ends the session."""
    renter, _parts, _local = local_market
    rental_id, stack_id = await renter.applied(WEB, name="link", isBasicAuthEnabled=True)
    (web,) = await renter.tunnels(rental_id, stack_id, 1)
    url, link = web["url"], web["auth"]["link"]
    token = link.split(f"{tunnel_auth.TOKEN_PARAM}=")[1]

    jar = tmp_path / "jar"
    # A page that sets the session and goes on to the service (a meta refresh: curl stops there)
    status, body = await asyncio.to_thread(_curl, "-c", str(jar), "-b", str(jar), link)
    assert status == 200 and "signed in" in body and 'http-equiv="refresh" content="0; url=/"' in body, body
    status, body = await asyncio.to_thread(_curl, "-b", str(jar), url)
    assert (status, body.strip()) == (200, "behind a password")
    jar_text = await asyncio.to_thread(jar.read_text)  # a file read, off the loop (blockbuster)
    cookie = [
        line.split("\t") for line in jar_text.splitlines() if f"\t{tunnel_auth.cookie_name(web['tunnelId'])}\t" in line
    ]
    assert len(cookie) == 1 and cookie[0][-1] != token, "a session cookie of its own, not the link's token"
    status, body = await asyncio.to_thread(_curl, "-L", link)
    assert status == 403 and "already used" in body, (status, body)
    status, body = await asyncio.to_thread(_curl, "-b", str(jar), url)
    assert (status, body.strip()) == (200, "behind a password"), "the session goes on"

    (again,) = await renter.tunnels(rental_id, stack_id, 1)
    assert again["auth"]["link"] != link, "every read mints a new link"
    async with browser_session(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
        async with browser.get(again["auth"]["link"]) as response:
            assert response.status == 200 and "signed in" in await response.text()
        async with browser.get(url) as response:  # the cookie alone, as a browser's next request
            assert (response.status, (await response.text()).strip()) == (200, "behind a password")
        async with browser.get(again["auth"]["link"]) as response:
            assert response.status == 403

    status, credentials = await renter.call("POST", f"/rentals/{rental_id}/stacks/{stack_id}/tunnel-password", {})
    assert status == 200 and credentials["password"] != web["auth"]["password"], credentials
    assert (await asyncio.to_thread(_curl, "-b", str(jar), url))[0] == 401, "the session ended with the password"
    old = url.replace("http://", f"http://renter:{web['auth']['password']}@")
    assert (await asyncio.to_thread(_curl, old))[0] == 401
    new = url.replace("http://", f"http://renter:{credentials['password']}@")
    assert await asyncio.to_thread(_curl, new) == (200, "behind a password\n")
    (shown,) = await renter.tunnels(rental_id, stack_id, 1)
    assert shown["auth"]["password"] == credentials["password"]
