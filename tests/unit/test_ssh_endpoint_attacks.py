"""Attacks on a rental's SSH endpoint and the container list it serves,
each pinned down as held (each failed against the code before its
fix). Pure: no Docker, no network but loopback."""

from __future__ import annotations

import asyncssh
from asyncssh.saslprep import saslprep

from gpuhost_agent.protocol import wire
from gpuhost_agent.streams.admission import over_caps
from gpuhost_agent.streams.limits import StreamLimits
from gpuhost_agent.streams.requests import SshRequest, TunnelRequest
from gpuhost_agent.streams.ssh import access as ssh_access
from gpuhost_agent.streams.ssh.access import RentalKeys, SshServices, parse_login
from gpuhost_agent.streams.ssh.server import Login

A_STACK = "3f2a9c1d-0000-4000-8000-00000000000a"
B_STACK = "9b1e44c0-0000-4000-8000-00000000000b"


def _container(rental: str, stack: str, service: str = "web") -> dict:
    return {
        "Id": f"{rental}-{service}",
        "State": "running",
        "Labels": {
            wire.LABEL_MANAGED: "true",
            wire.LABEL_ENV: "env",
            wire.LABEL_RENTAL: rental,
            wire.LABEL_STACK: stack,
            wire.LABEL_SSH: "true",
            ssh_access.SERVICE_LABEL: service,
            ssh_access.NUMBER_LABEL: "1",
        },
    }


class _Docker:
    def __init__(self, containers: list[dict]):
        self.containers, self.calls = containers, 0

    async def __call__(self, stack_id: str) -> list[dict]:
        self.calls += 1
        return [c for c in self.containers if c["Labels"][wire.LABEL_STACK] == stack_id]


def _login(rental: str, stack_ids: tuple[str, ...], docker: _Docker, keys: dict[str, list[str]]) -> Login:
    async def fetch(rental_id: str) -> list[str]:
        return keys.get(rental_id, [])

    services = SshServices(engine=None, keys=RentalKeys(fetch), host_key=None, list_stack=docker)  # type: ignore[arg-type]
    return Login(services, SshRequest("s1", rental, stack_ids), "env", lambda slot: None)  # type: ignore[arg-type,return-value]


def _key() -> asyncssh.SSHKey:
    return asyncssh.generate_private_key("ssh-ed25519")


def _line(key: asyncssh.SSHKey) -> str:
    return key.export_public_key("openssh").decode()


async def test_held_another_rentals_stack_listed_by_the_marketplace_is_refused_on_labels():
    """A marketplace bug or a compromised relay lists rental B's stack in
    rental A's ssh request; A's renter names it: Docker's labels refuse."""
    a_key, b_key = _key(), _key()
    docker = _Docker([_container("rental-a", A_STACK), _container("rental-b", B_STACK)])
    keys = {"rental-a": [_line(a_key)], "rental-b": [_line(b_key)]}
    login = _login("rental-a", (A_STACK, B_STACK), docker, keys)
    assert await login.validate_public_key("web." + B_STACK[:8], a_key)  # the key and the name alone
    login.auth_completed()  # the signature passed: now the container, on Docker's labels
    missing = await login.looked_up()
    assert missing and "no running container of service 'web'" in missing and login.container is None
    own = _login("rental-a", (A_STACK, B_STACK), docker, keys)
    assert await own.validate_public_key("web." + A_STACK[:8], a_key)  # the renter's own stack opens
    own.auth_completed()
    assert await own.looked_up() is None and own.container is not None
    # B's renter's key on A's endpoint, with A's login name: the keys are the rental's
    assert not await _login("rental-a", (A_STACK,), docker, keys).validate_public_key("web." + A_STACK[:8], b_key)


def test_held_login_name_spellings():
    """Crafted names pick nothing beyond the listed stacks: no empty service,
    no short or long prefix, no unicode look-alike (asyncssh's SASLprep maps
    full-width digits to ASCII before the agent sees the name, which can only
    land on this rental's own stack)."""
    stacks = (A_STACK,)
    for name in (
        "",
        ".",
        "." + A_STACK[:8],
        "web." + A_STACK[:7],
        "web." + A_STACK[:9],
        "web." + A_STACK,
        "web." + A_STACK[:8].upper(),
        "web." + A_STACK[:7] + "\u0661",
        "web\x00." + A_STACK[:8] + "\x00",
    ):
        picked = parse_login(name, stacks)
        assert picked is None or picked[1] == A_STACK, name
    for crafted in ("web.\uff13f2a9c1d", "\uff57\uff45\uff42.3f2a9c1d", "web\u00ad.3f2a9c1d"):
        assert parse_login(saslprep(crafted), (A_STACK, B_STACK)) == ("web", A_STACK), crafted  # only its own
    for crafted in ("web.\uff19b1e44c0", "web.9b1e44c0\u200b"):
        assert parse_login(saslprep(crafted), (A_STACK,)) is None, crafted  # B's stack is not listed here


async def test_a_login_without_a_valid_key_costs_no_docker_call():
    """Anyone who reaches the endpoint (on the
    marketplace: the public host:port) and knows a login name (it is pasted
    in docs, shell history, screenshots) made the agent list the stack's
    containers on every USERAUTH_REQUEST before its key was looked at, and
    the timing told which service names exist. The key is checked first now
    (RentalKeys: no Docker call); the container is looked up once a key
    passes, once per name on the connection."""
    docker = _Docker([_container("rental-a", A_STACK)])
    login = _login("rental-a", (A_STACK,), docker, {"rental-a": [_line(_key())]})
    stranger = _key()
    for _ in range(100):
        assert not await login.validate_public_key("web." + A_STACK[:8], stranger)
    assert docker.calls == 0, f"{docker.calls} Docker list calls for 100 refused logins"


async def test_a_connection_is_closed_after_six_refused_logins():
    """OpenSSH's MaxAuthTries: past 6 refused keys on one connection it is
    closed (asyncssh puts no cap on attempts in the login window); the
    renter's key, asked twice (the key, then its signature), lists the
    stack once."""
    docker, renter = _Docker([_container("rental-a", A_STACK)]), _key()
    login = _login("rental-a", (A_STACK,), docker, {"rental-a": [_line(renter)]})

    class _Conn:
        closed: list[int] = []

        def disconnect(self, code: int, reason: str) -> None:
            self.closed.append(code)

    conn = _Conn()
    login.connection_made(conn)  # type: ignore[arg-type]
    assert await login.validate_public_key("web." + A_STACK[:8], renter)
    assert await login.validate_public_key("web." + A_STACK[:8], renter)
    assert docker.calls == 0  # the key query and its signature: no Docker call (PK_OK)
    for _ in range(5):
        assert not await login.validate_public_key("web." + A_STACK[:8], _key())
    assert conn.closed == []
    assert not await login.validate_public_key("nope", _key())
    assert conn.closed == [asyncssh.DISC_NO_MORE_AUTH_METHODS_AVAILABLE]
    login.auth_completed()  # had the renter's signature passed: the stack listed once
    assert await login.looked_up() is None and docker.calls == 1


def test_strangers_cannot_fill_a_rentals_connection_cap():
    """Each TCP connection to rental B's SSH endpoint
    is an `ssh` stream, admitted before the handshake; 1024 of them (held
    30 s each by LOGIN_TIMEOUT, renewed) refused B's renter every tunnel and
    SSH login with 429. Connections not logged in count on the host's cap
    and a few places of their own now (test_stream_limits has the rest)."""
    caps = StreamLimits()
    stranger_connections = [SshRequest(f"x{n}", "rental-b", (B_STACK,)) for n in range(caps.connections_per_rental)]
    renters_tunnel = TunnelRequest("mine", "rental-b", B_STACK, "c", 8888)
    assert over_caps(renters_tunnel, stranger_connections, caps) is None


def test_two_rentals_cannot_take_every_connection_of_the_host():
    """A rental's cap is a quarter of the host's, and
    never more than half of what the others leave free."""
    caps = StreamLimits()
    mine = [
        TunnelRequest(f"{r}{n}", r, "s", "c", 80)
        for r in ("mine-1", "mine-2")
        for n in range(caps.connections_per_rental)
    ]
    assert over_caps(TunnelRequest("victim", "victim", "s", "c", 80), mine, caps) is None


async def test_the_catalogue_does_not_name_other_rentals():
    """GET /environments/listings (seed35) is what any renter browses; each
    Listing carries activeRentalIds, so a renter learns the ids of other
    renters' rentals (and when they start and end) on a host."""
    import aiohttp

    from gpuhost_agent.local_marketplace import server
    from gpuhost_agent.local_marketplace.state import MarketplaceState
    from gpuhost_agent.local_marketplace.store import Store

    running = await server.start(MarketplaceState(Store.load_or_create(None)), port=0)
    store = running.state.store
    try:
        async with aiohttp.ClientSession(headers={wire.API_KEY_HEADER: store.renterApiKey}) as http:
            async with http.post(running.base_url + "/rentals", json={"envId": store.envId}) as response:
                assert response.status == 201
                someone_elses = (await response.json())["rentalId"]
            async with http.get(running.base_url + "/environments/listings") as response:
                text = await response.text()
        assert someone_elses not in text
    finally:
        await running.stop()
