"""No single bad input or bad actor stops the host, one test for each.
What a stray client can send before it is authenticated, and
records a marketplace must not take."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import urlsplit


async def _raw_request(base_url: str, head: bytes) -> tuple[int, bytes]:
    """One HTTP/1.1 request written byte for byte (a client library would
    refuse these headers), and the status and body of the answer."""
    url = urlsplit(base_url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    writer.write(head)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


async def test_an_api_key_that_is_not_utf8_is_refused_with_401_not_500(market, log_stream) -> None:
    host = urlsplit(market.base_url).netloc.encode()
    for path in (b"/v1/environments", b"/v1/agent/jobs"):
        for key in (b"\xff\xfe", b"caf\xe9", b"\xc3"):
            head = b"GET " + path + b" HTTP/1.1\r\nHost: " + host + b"\r\nX-API-Key: " + key
            status, body = await _raw_request(market.base_url, head + b"\r\nConnection: close\r\n\r\n")
            assert status == 401, (path, key, body)
            assert "X-API-Key" in json.loads(body)["message"]
    assert "Traceback" not in log_stream.getvalue() and '"level": "error"' not in log_stream.getvalue()


def test_a_terminal_token_that_is_not_utf8_is_a_401() -> None:
    import pytest

    from gpuhost_agent.local_marketplace.terminal_tickets import TicketBook, TicketRejected

    tickets = TicketBook()
    ticket = tickets.issue("r", "s", "c" * 64, {})
    for token in ("\udcff\udcfe", "caf\xe9"):
        with pytest.raises(TicketRejected) as refused:
            tickets.check(ticket.terminal_id, token)
        assert refused.value.status == 401


async def test_a_report_dated_in_the_future_is_refused_and_cannot_lock_out_real_ones(market) -> None:
    """An initState of year 3628 was taken, and every
    later, real report then looked stale and was dropped."""
    from gpuhost_agent.protocol import wire_time

    key = market.store.envApiKey
    state = {"state": "starting", "phase": None, "error": None, "phases": [], "updatedAt": "3628-01-01T00:00:00Z"}
    status, body = await market.call("PUT", "/agent/init-state", state, key=key)
    assert status == 400 and "updatedAt is" in body["message"] and "ahead of the marketplace's clock" in body["message"]
    status, _ = await market.call("PUT", "/agent/init-state", {**state, "updatedAt": wire_time.iso()}, key=key)
    assert status in (200, 204)
    for path, field_name, extra in (
        ("/agent/stacks/s1/status", "reportedAt", {"status": "APPLYING"}),
        ("/agent/stacks/s1/containers", "observedAt", {"containers": []}),
        ("/agent/system-data", "reportedAt", {"systemData": {}, "fingerprint": "0123456789abcdef", "listing": {}}),
    ):
        status, body = await market.call("PUT", path, {**extra, field_name: "2999-01-01T00:00:00Z"}, key=key)
        assert status == 400 and f"{field_name} is" in body["message"], (path, body)


async def test_a_405_says_which_methods_the_path_has(market) -> None:
    """The JSON 405 had lost aiohttp's Allow header."""
    async with market.http.delete(
        market.base_url + "/environments", headers={"X-API-Key": market.store.renterApiKey}
    ) as answer:
        assert answer.status == 405
        assert "GET" in answer.headers["Allow"]
        assert (await answer.json())["status"] == 405


async def test_a_rental_name_with_a_lone_surrogate_is_refused_like_a_template(market) -> None:
    """A rental name with a lone surrogate is refused, as a template with one is."""
    status, body = await market.call(
        "POST", "/rentals", raw=b'{"envId": "%s", "name": "a\\ud800b"}' % market.store.envId.encode()
    )
    assert status == 400 and "lone surrogate" in body["message"]
    status, _ = await market.call("POST", "/rentals", {"envId": market.store.envId, "name": "caf\u00e9 \u2615"})
    assert status == 201


async def test_an_end_date_with_an_offset_is_stored_and_served_in_utc(market) -> None:
    """endDate kept the renter's offset, the documents say UTC."""
    status, rental = await market.call(
        "POST", "/rentals", {"envId": market.store.envId, "endDate": "2030-01-01T05:00:00+05:00"}
    )
    assert status == 201 and rental["endDate"] == "2030-01-01T00:00:00.000000Z"


async def test_a_request_aiohttp_cannot_parse_leaves_no_traceback(market, log_stream) -> None:
    """A too-long header line got a 400 and an ERROR with a
    traceback in the operator's log; a stray client's bad bytes are not a bug."""
    host = urlsplit(market.base_url).netloc.encode()
    head = b"GET /v1/environments HTTP/1.1\r\nHost: " + host + b"\r\nX-Long: " + b"a" * 10_000
    status, body = await _raw_request(market.base_url, head + b"\r\nConnection: close\r\n\r\n")
    assert status == 400
    assert json.loads(body)["status"] == 400
    await asyncio.sleep(0.1)
    written = log_stream.getvalue()
    assert "Traceback" not in written and '"level": "error"' not in written, written[-2000:]
    assert "http_request_unparsable" in written


async def test_a_whole_number_float_is_an_integer_as_json_schema_says(market) -> None:
    """692.0 is an integer to JSON Schema; it was refused."""
    status, rental = await market.call("POST", "/rentals", {"envId": market.store.envId, "gpuCount": 2.0})
    assert status == 201
    assert market.store.rentals[rental["rentalId"]]["gpuCount"] == 2 and type(rental["listing"]["selectedGPUs"]) is int
    status, body = await market.call("POST", "/rentals", {"envId": market.store.envId, "gpuCount": 2.5})
    assert status == 400 and "gpuCount" in body["message"]


async def test_the_agent_paths_enforce_the_session_header_wait_and_capabilities_as_documented(market) -> None:
    """A session header that is no UUID, a wait over 60 s
    and any list of capabilities were all taken."""
    key = market.store.envApiKey
    status, session = await market.call(
        "POST", "/agent/sessions", {"capabilities": ["stack.deploy", "later.job"]}, key=key
    )
    assert status == 200  # a name this marketplace does not know is ignored: a newer agent may send more
    for caps in (["x" * 65], [""], ["a"] * 33, "stack.deploy"):
        status, body = await market.call("POST", "/agent/sessions", {"capabilities": caps}, key=key)
        assert status == 400 and "capabilities" in body["message"], caps
    for query in ("wait=61", "wait=-1", "wait=nan", "max=0", "max=101"):
        status, body = await market.call("GET", f"/agent/jobs?{query}", key=key)
        assert status == 400 and "wait must be from 0 to 60" in body["message"], query
    async with market.http.get(
        market.base_url + "/agent/desired-state", headers={"X-API-Key": key, "X-Agent-Session": "not-a-session"}
    ) as answer:
        assert answer.status == 400 and "X-Agent-Session" in (await answer.json())["message"]


async def test_one_rental_cannot_make_stacks_without_end(market) -> None:
    """Stacks per rental were unlimited; each makes a
    Docker network, and one rental used up the host's address pools."""
    from gpuhost_agent.local_marketplace.state import STACKS_PER_RENTAL as MAX_STACKS_PER_RENTAL

    rental, other = await market.rental(), await market.rental()
    template = {"template": {"name": "s", "description": "", "content": "services: {}", "environmentVariables": {}}}
    for _ in range(MAX_STACKS_PER_RENTAL):
        status, body = await market.call("POST", f"/rentals/{rental}/stacks", template)
        assert status == 201, body
    status, body = await market.call("POST", f"/rentals/{rental}/stacks", template)
    assert status == 409 and f"the most one rental may have ({MAX_STACKS_PER_RENTAL})" in body["message"]
    status, _ = await market.call("POST", f"/rentals/{other}/stacks", template)
    assert status == 201


async def test_a_chunked_body_over_the_limit_is_a_400_as_documented(market) -> None:
    """A chunked body past the cap got aiohttp's 413, the documents say 400."""

    async def chunks():
        for _ in range(3):
            yield b" " * (1024 * 1024)

    async with market.http.post(
        market.base_url + "/rentals", data=chunks(), headers={"X-API-Key": market.store.renterApiKey}
    ) as answer:
        assert answer.status == 400
        assert "body larger than" in (await answer.json())["message"]


async def test_an_idle_or_stalled_connection_is_closed() -> None:
    """1 000 idle sockets were held for 40 s (1 063 descriptors)."""
    import time

    from gpuhost_agent.local_marketplace import server
    from gpuhost_agent.local_marketplace.state import MarketplaceState
    from gpuhost_agent.local_marketplace.store import Store

    running = await server.start(MarketplaceState(Store.load_or_create(None)), "127.0.0.1", 0, idle_seconds=0.5)
    try:
        url = urlsplit(running.base_url)
        for first_bytes in (b"", b"GET /v1/environments HTTP/1.1\r\nHost: x\r\n"):  # nothing; headers that stop
            reader, writer = await asyncio.open_connection(url.hostname, url.port)
            writer.write(first_bytes)
            started = time.monotonic()
            assert await asyncio.wait_for(reader.read(), 10) == b""
            assert time.monotonic() - started < 5, first_bytes
            writer.close()
    finally:
        await running.stop()


async def test_what_aiohttp_answers_itself_is_json_like_every_other_error(market) -> None:
    """A URL or header over 8 KiB, bytes that are not HTTP,
    answered by aiohttp before any handler runs, came back as plain text
    quoting the client's bytes. curl, a client we did not write, sends them."""
    long_url = market.base_url + "/environments?" + "q" * 9000
    long_header = ["-H", "X-Big: " + "b" * 9000, market.base_url + "/environments"]
    for args in ([long_url], long_header):
        curl = await asyncio.create_subprocess_exec(
            "curl", "-sS", "-i", "--max-time", "10", *args, stdout=asyncio.subprocess.PIPE
        )
        out, _ = await curl.communicate()
        head, _, body = out.partition(b"\r\n\r\n")
        assert head.split()[1] == b"400" and b"application/json" in head, out[:300]
        answer = json.loads(body)
        assert answer["status"] == 400 and answer["message"].startswith("Bad Request: Got more than")
        assert "qqqq" not in answer["message"] and "bbbb" not in answer["message"]
    status, body = await _raw_request(market.base_url, b"\x16\x03\x01 not http at all\r\n\r\n")
    assert status == 400 and json.loads(body)["status"] == 400
