"""OpenSSH's sftp cannot reach a host file through an operation the agent does
not serve. `ln` (hardlink@openssh.com)
and `chmod -h` (lsetstat@openssh.com) were asyncssh's own defaults, run by the
agent as root on the host's paths: a renter linked root-only host files into
its volume and made them setuid. Before the change this test's host file got a
second link and mode 4777; now both are refused and it is as it was."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

from support.ssh_clients import Endpoint, make_key, ssh_stack
from support.stacks import TEST_IMAGE

STACK = f"""
services:
  shell:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "exec sleep 100000"]
    stop_grace_period: 1s
"""


async def test_sftp_link_and_chmod_h_never_reach_a_host_file(local_market, tmp_path: Path) -> None:
    renter, _parts, _local = local_market
    key = tmp_path / "renter"
    _stack_id, endpoints = await ssh_stack(renter, await asyncio.to_thread(make_key, key), STACK, 1, "sftp-host")
    info = endpoints["shell"]
    end = await asyncio.to_thread(Endpoint, info["host"], info["port"], info["hostKey"], tmp_path)
    host_file = tmp_path / "root-only"
    await asyncio.to_thread(host_file.write_text, "a host file\n")
    await asyncio.to_thread(host_file.chmod, 0o600)

    done = await asyncio.to_thread(
        end.sftp, key, info["user"], f"-ln {host_file} {tmp_path}/linked\n-chmod -h 4777 {host_file}\nls /\n"
    )

    after = await asyncio.to_thread(host_file.stat)
    assert stat.S_IMODE(after.st_mode) == 0o600 and after.st_nlink == 1, (oct(after.st_mode), after.st_nlink)
    assert not await asyncio.to_thread((tmp_path / "linked").exists)
    assert done.returncode == 0, done.stderr  # the session goes on: the two are refused, `ls /` served
    assert done.stderr.lower().count(b"unsupported") == 2, done.stderr  # OpenSSH names the status
