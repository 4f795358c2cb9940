"""SSH into a Swarm stack's containers on either machine, end to end, with
OpenSSH's own ssh, scp and sftp: the leader agent process on the manager, a
worker agent process on machine 2, the local marketplace, a renter.

The login is the leader's (its SSH server, its key check); what only the
container's machine can do is done there: the exec by its engine, the file
helper and the hang-up of a session that ends first by its agent (the
worker's log names each). A container on the leader's own machine is reached
as well: Swarm's containers carry no Compose service label, so the login's
list comes from the manager's tasks on both."""

from __future__ import annotations

import asyncio
import hashlib
import uuid

import pytest
from support.ssh_clients import Endpoint, PtySsh, registered_key
from support.swarm import GPU_STACK, applied_trains, labelled, leader_ready
from support.waiting import until

pytestmark = pytest.mark.swarm


def _ssh_entry(tunnel: dict) -> bool:
    return tunnel["protocol"] == "ssh" and tunnel["service"] == "train" and bool(tunnel["ssh"]["hostKey"])


async def _sessions(end: Endpoint, key, user: str, tmp_path) -> str:
    """A command, files both ways and a listing: the command's hostname."""
    done = await asyncio.to_thread(end.ssh, key, user, "mkdir -p /tmp; echo host-$(hostname); echo err >&2; exit 7")
    assert (done.returncode, done.stderr) == (7, b"err\n"), done
    hostname = done.stdout.decode().strip().removeprefix("host-")
    done = await asyncio.to_thread(end.ssh, key, user, "wc -c", stdin=b"x" * 100_000)  # stdin to its EOF
    assert done.returncode == 0 and done.stdout.split() == [b"100000"], done
    payload = uuid.uuid4().bytes * 20_000  # 320 KB
    await asyncio.to_thread((tmp_path / "up.bin").write_bytes, payload)
    done = await asyncio.to_thread(end.scp, key, str(tmp_path / "up.bin"), end.remote(user, "/tmp/up.bin"))
    assert done.returncode == 0, done.stderr
    done = await asyncio.to_thread(end.ssh, key, user, "md5sum < /tmp/up.bin")
    assert done.stdout.split()[0].decode() == hashlib.md5(payload).hexdigest()
    done = await asyncio.to_thread(end.scp, key, end.remote(user, "/tmp/up.bin"), str(tmp_path / "down.bin"))
    assert done.returncode == 0 and await asyncio.to_thread((tmp_path / "down.bin").read_bytes) == payload
    done = await asyncio.to_thread(end.sftp, key, user, "ls -la /tmp\n")
    assert done.returncode == 0 and b"up.bin" in done.stdout, done
    return hostname


async def test_ssh_scp_and_sftp_reach_a_container_on_either_machine(swarm_leader, swarm_worker, tmp_path) -> None:
    (renter, market, agent), machines = swarm_leader
    worker = swarm_worker
    await leader_ready(agent, market)
    key = await registered_key(renter, tmp_path / "renter")
    rentals = [await renter.rental(gpu_count=2), await renter.rental(gpu_count=2)]
    stacks = {rental_id: await renter.stack(rental_id, GPU_STACK, isSSHEnabled=True) for rental_id in rentals}
    reached = {}
    for rental_id, (stack_id, train) in (await applied_trains(renter, stacks)).items():
        (tunnel,) = await renter.tunnels(rental_id, stack_id, 1, _ssh_entry, timeout=30)
        info = tunnel["ssh"]
        workdir = tmp_path / stack_id  # a known_hosts file of its own: each stack has its own port
        await asyncio.to_thread(workdir.mkdir)
        end = await asyncio.to_thread(Endpoint, info["host"], info["port"], info["hostKey"], workdir)
        machine = machines[labelled(train)["com.docker.swarm.node.id"]]
        hostname = await _sessions(end, key, info["user"], tmp_path)
        assert hostname == train["Id"][:12], machine  # that container, wherever it runs
        reached[machine] = (end, info["user"])
    assert sorted(reached) == [1, 2]
    log = await asyncio.to_thread(worker.log_path.read_text)
    assert '"what": "files"' in log  # machine 2's file sessions were its agent's

    # A session that ends before its command: the command ends too, on machine 2
    end, user = reached[2]

    async def sleeping() -> bool:
        done = await asyncio.to_thread(end.ssh, key, user, "ps")
        if done.returncode == 126 and not done.stdout + done.stderr:
            # The engine could not start the exec, silently: runc 1.1 on cgroup v1 sometimes fails an
            # exec that starts beside another one (the terminal's shell, starting now). Asked again.
            return False
        assert done.returncode == 0, done
        return b"sleep 4321" in done.stdout

    terminal = await asyncio.to_thread(PtySsh, end, key, user, 24, 80)
    try:
        await asyncio.to_thread(terminal.type, "sleep 4321\n")
        await until(sleeping, timeout=20)
    finally:
        terminal.process.kill()  # the renter's client gone, as a closed laptop lid
        await asyncio.to_thread(terminal.close)
    await until(lambda: not_(sleeping), timeout=20)

    async def hung_up() -> bool:  # the worker logs its act once done: a moment after the process went
        return '"what": "hangup"' in await asyncio.to_thread(worker.log_path.read_text)

    await until(hung_up, timeout=10)


async def not_(check) -> bool:
    return not await check()
