"""A tunnel keeps its port across restarts of the marketplace (and so of the
agent, whose reports only reopen the listeners): the store keeps each
endpoint's port, one SSH endpoint per rental. A port
taken meanwhile is said, in the tunnel info, and another is used."""

from __future__ import annotations

import asyncio
import socket

from gpuhost_agent.local_marketplace.channel_hub import ChannelHub
from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.local_marketplace.tunnels import book as tunnels
from gpuhost_agent.local_marketplace.tunnels.book import TunnelBook
from gpuhost_agent.protocol import wire, wire_time

TEMPLATE = {"name": "n", "description": "d", "content": "services: {}\n", "environmentVariables": {}}


def _applied(store: Store, rental_id: str | None = None) -> str:
    """An APPLIED SSH-enabled stack with one running container, of a new rental unless one is named."""
    rental_id = rental_id or store.create_rental(name="r", gpu_count=0, end_date=None)["rentalId"]
    stack = store.create_stack(rental_id, {**TEMPLATE, "isSSHEnabled": True})
    stack["status"] = wire.APPLIED
    container = {
        "Id": "a" * 64,
        "Name": "p-web-1",
        "State": "running",
        "Labels": ["com.docker.compose.service=web"],
        "Ports": [{"PrivatePort": 9000, "Type": "tcp"}],
    }
    store.containers[stack["stackId"]] = {"observedAt": wire_time.iso(), "containers": [container]}
    store.save()
    return stack["stackId"]


async def _ports(store: Store) -> tuple[TunnelBook, dict[str, dict]]:
    book = TunnelBook(store, ChannelHub())
    await book.sync()
    stack_id = next(iter(store.stacks))
    return book, {entry["protocol"]: entry for entry in book.for_stack(stack_id)}


async def test_ports_are_kept_across_a_restart_and_a_taken_one_is_said(tmp_path) -> None:
    path = tmp_path / "market.json"
    store = Store.load_or_create(path)
    _applied(store)
    book, first = await _ports(store)
    assert first["tcp"]["notice"] is None and first["ssh"]["notice"] is None
    await book.close_all()

    again = Store.load_or_create(path)  # the marketplace started again from its file
    book, second = await _ports(again)
    assert {p: e["port"] for p, e in second.items()} == {p: e["port"] for p, e in first.items()}
    assert second["ssh"]["ssh"]["command"].startswith(f"ssh -i ~/.ssh/id_ed25519 -p {first['ssh']['port']} ")
    await book.close_all()

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", first["tcp"]["port"]))
        squatter.listen()
        book, third = await _ports(Store.load_or_create(path))
        await book.close_all()
    assert third["tcp"]["port"] != first["tcp"]["port"]
    assert third["tcp"]["notice"] == (
        f"port {first['tcp']['port']}, this tunnel's before, was taken when it reopened: "
        f"it moved to {third['tcp']['port']}"
    )
    assert third["ssh"]["port"] == first["ssh"]["port"] and third["ssh"]["notice"] is None
    assert (
        Store.load_or_create(path).endpoints[next(k for k in again.endpoints if k.endswith("/9000"))]
        == (third["tcp"]["port"])
    ), "the new port is kept from then on"


async def test_a_removed_stack_forgets_its_ports_and_an_ended_rental_its_ssh_endpoint(tmp_path) -> None:
    store = Store.load_or_create(tmp_path / "market.json")
    stack_id = _applied(store)
    rental_id = store.stacks[stack_id]["rentalId"]
    book, _ = await _ports(store)
    assert len(store.endpoints) == 2
    store.apply_status(stack_id, {"status": wire.REMOVED, "reportedAt": wire_time.iso()})
    await book.sync()
    assert list(store.endpoints) == [f"rental/{rental_id}/ssh"]  # kept for the rental's next SSH stack
    store.end_rental(rental_id)
    await book.sync()
    assert store.endpoints == {}
    await book.close_all()


async def test_one_ssh_endpoint_per_rental_the_login_name_picks_the_stack(tmp_path) -> None:
    """Two SSH-enabled stacks of one rental share one port; each stack's
    tunnel info names its own login, and the ssh request names both stacks
    for the agent to pick from. Another rental's stack has an endpoint of its
    own, and is not among the first rental's."""
    store = Store.load_or_create(tmp_path / "market.json")
    first = _applied(store)
    rental_id = store.stacks[first]["rentalId"]
    second = _applied(store, rental_id)
    elsewhere = _applied(store)
    book = TunnelBook(store, ChannelHub())
    await book.sync()
    try:
        ssh = {s: next(e for e in book.for_stack(s) if e["protocol"] == "ssh") for s in (first, second, elsewhere)}
        assert ssh[first]["port"] == ssh[second]["port"] != ssh[elsewhere]["port"]
        assert ssh[first]["ssh"]["user"] == f"web.{first[:8]}" and ssh[second]["ssh"]["user"] == f"web.{second[:8]}"
        assert ssh[first]["tunnelId"] != ssh[second]["tunnelId"]
        [endpoint] = [t for t in book.tunnels.values() if t.protocol == "ssh" and t.key.rental_id == rental_id]
        assert book._fields(endpoint) == {"stackIds": [first, second]}
        assert sorted(k for k in store.endpoints if k.endswith("/ssh")) == sorted(
            f"rental/{store.stacks[s]['rentalId']}/ssh" for s in (first, elsewhere)
        )
        store.apply_status(first, {"status": wire.REMOVED, "reportedAt": wire_time.iso()})
        await book.sync()
        assert book._fields(endpoint) == {"stackIds": [second]} and book.tunnels[endpoint.key] is endpoint
    finally:
        await book.close_all()


async def test_a_new_port_skips_the_ports_kept_for_other_tunnels(tmp_path, monkeypatch) -> None:
    """While a stack redeploys its tunnels are closed and their ports free: a
    new tunnel of another stack must not take one. The system's pick is made
    to be such a port first (it could be, any time), then left to the system."""
    store = Store.load_or_create(tmp_path / "market.json")
    with socket.socket() as probe:  # a port free now, as a closed tunnel's is
        probe.bind(("127.0.0.1", 0))
        kept = probe.getsockname()[1]
    store.endpoints["another-stack/p-web-1/8888"] = kept
    store.stacks["another-stack"] = {"rentalId": "none", "status": "DEPLOYING"}  # redeploying: no tunnel now
    real = asyncio.start_server
    picks: list[int] = []

    async def system_picks_the_kept_port_first(serve, host, port, **kwargs):  # type: ignore[no-untyped-def]
        if port == 0 and not picks:
            port = kept
        server = await real(serve, host, port, **kwargs)
        picks.append(server.sockets[0].getsockname()[1])
        return server

    monkeypatch.setattr(tunnels.asyncio, "start_server", system_picks_the_kept_port_first)
    _applied(store)
    book = TunnelBook(store, ChannelHub())
    await book.sync()
    try:
        ports = {entry["port"] for entry in book.for_stack(next(s for s in store.stacks if s != "another-stack"))}
        assert picks[0] == kept and kept not in ports, (picks, ports)
        with socket.socket() as owner:  # the refused listener was closed: the owner reopens on its port
            owner.bind(("127.0.0.1", kept))
    finally:
        await book.close_all()
