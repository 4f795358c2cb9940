"""One SSH endpoint per rental that stays put, with OpenSSH.

A renter's rental runs two SSH-enabled stacks. Both are reached through one
host:port, the login name picking the stack; the command the tunnel info
gives is run as pasted (the renter's key for `-i`, StrictHostKeyChecking=yes
with the host key pinned by the command itself). Then the agent restarts,
and the local marketplace too (a new one from its file, on the same port):
the same pasted commands work again, on the same port, with the same host
key, the pin accepted. A login name naming another rental's stack is refused
exactly as an unknown one.
"""

from __future__ import annotations

import asyncio
import shlex
import subprocess

from support.agent_process import Market, process_world
from support.renter import Renter
from support.ssh_clients import make_key, ssh_ready
from support.stacks import TEST_IMAGE

from gpuhost_agent.protocol import wire


def _content(marker: str) -> str:
    return f"""
services:
  shell:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "echo {marker} > /which && exec sleep 100000"]
    stop_grace_period: 1s
"""


async def _applied(renter: Renter, rental_id: str, marker: str) -> str:
    stack_id = await renter.stack(rental_id, _content(marker), name=marker, isSSHEnabled=True)
    stack = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=90)
    assert stack["status"] == wire.APPLIED, stack["errorMsg"]
    return stack_id


async def _ssh_info(renter: Renter, rental_id: str, stack_id: str) -> dict:
    [tunnel] = await renter.tunnels(rental_id, stack_id, 1, ssh_ready, timeout=60)
    return tunnel["ssh"]


def _pasted(command: str, key: str, user: str | None = None) -> list[str]:
    """The tunnel info's command as a renter pastes it, their key for ssh-keygen's
    default file, no known_hosts of theirs (the command's pin is all there is),
    `cat /which` after it; `user` in place of the login name, if given."""
    pasted = command.replace("~/.ssh/id_ed25519", shlex.quote(key), 1)
    pasted = pasted.replace("ssh ", "ssh -o BatchMode=yes -o UserKnownHostsFile=/dev/null ", 1)
    if user is not None:
        pasted = pasted.rsplit(" ", 1)[0] + f" {user}@127.0.0.1"
    return ["bash", "-c", pasted + " cat /which"]


async def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return await asyncio.to_thread(subprocess.run, argv, capture_output=True, timeout=60)


async def _works(command: str, key: str, marker: str, timeout: float = 60) -> None:
    """The pasted command prints the stack's marker: retried while the agent reconnects."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        done = await _run(_pasted(command, key))
        if (done.returncode, done.stdout) == (0, f"{marker}\n".encode()):
            return
        assert asyncio.get_running_loop().time() < deadline, (command, done)
        await asyncio.sleep(0.5)


async def test_one_endpoint_per_rental_as_pasted_across_restarts(tmp_path, docker_client):
    key = str(tmp_path / "renter")
    async with process_world(tmp_path, docker_client) as (renter, market, agent):
        await agent.start()
        status, body = await renter.call(
            "POST", "/users/ssh-key", {"publicKey": await asyncio.to_thread(make_key, tmp_path / "renter")}
        )
        assert status == 200, body
        rental_id, other_rental = await renter.rental(), await renter.rental()
        first, second, elsewhere = await asyncio.gather(
            _applied(renter, rental_id, "first"),
            _applied(renter, rental_id, "second"),
            _applied(renter, other_rental, "elsewhere"),
        )
        info = {s: await _ssh_info(renter, rental_id, s) for s in (first, second)}
        other = await _ssh_info(renter, other_rental, elsewhere)

        # One host:port for the rental, a login name per stack; another rental has its own
        assert info[first]["port"] == info[second]["port"] != other["port"]
        assert (info[first]["user"], info[second]["user"]) == (f"shell.{first[:8]}", f"shell.{second[:8]}")
        assert info[first]["hostKey"] == info[second]["hostKey"] == other["hostKey"]
        for stack_id, marker in ((first, "first"), (second, "second")):
            assert "-o StrictHostKeyChecking=yes" in info[stack_id]["command"]
            await _works(info[stack_id]["command"], key, marker)

        # Another rental's stack through this rental's endpoint: refused as a name of no stack is
        command = info[first]["command"]
        foreign = await _run(_pasted(command, key, other["user"]))
        unknown = await _run(_pasted(command, key, "shell.00000000"))
        assert foreign.returncode == unknown.returncode == 255, (foreign, unknown)
        assert foreign.stderr.replace(other["user"].encode(), b"USER") == unknown.stderr.replace(
            b"shell.00000000", b"USER"
        )
        assert b"Permission denied" in foreign.stderr, foreign

        # The agent restarts, then the marketplace too: a new one from its file, on the same port
        assert await agent.stop() == 0
        await agent.start()
        for stack_id, marker in ((first, "first"), (second, "second")):
            await _works(info[stack_id]["command"], key, marker)
        await market.stop()
        again = Market(tmp_path / "market.json")
        again.port = market.port
        await again.start()
        try:
            renter_again = Renter(renter.http, again.base_url, again.store)
            for stack_id, marker in ((first, "first"), (second, "second")):
                now = await _ssh_info(renter_again, rental_id, stack_id)
                assert now == info[stack_id], "the same port, host key, login name and command"
                await _works(now["command"], key, marker)
            assert (await _ssh_info(renter_again, other_rental, elsewhere))["port"] == other["port"]
        finally:
            await agent.stop()
            await again.stop()
