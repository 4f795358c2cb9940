"""SFTP's copy-data within one file.

asyncssh serves copy-data as a loop of the server's read and write until a
read comes back short; a copy forward within one file, to its end
(`remote_copy(f, f, 0, 0, n)`), never comes back short: the file grew until
the rental's disk was full, a helper and the agent busy all along. asyncssh's
own client sends it (OpenSSH's sftp `copy` opens two handles). Such a copy is
refused at once and the file stays as it was; a copy between two files, or
backward within one, is served.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import asyncssh
import pytest
from support.ssh_clients import make_key, ssh_stack
from support.stacks import TEST_IMAGE

STACK = f"""
services:
  shell:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "exec sleep 100000"]
    stop_grace_period: 1s
"""
SIZE = 300 * 1024  # more than one read of the copy loop (256 KiB)


async def test_copy_data_forward_within_one_file_is_refused_and_between_files_served(local_market, tmp_path: Path):
    renter, _parts, _local = local_market
    key = tmp_path / "renter"
    _stack_id, endpoints = await ssh_stack(renter, await asyncio.to_thread(make_key, key), STACK, 1, "copy-data")
    info = endpoints["shell"]
    known = asyncssh.import_known_hosts(f"[{info['host']}]:{info['port']} {info['hostKey']}\n")
    client_key = await asyncio.to_thread(asyncssh.read_private_key, str(key))
    async with asyncssh.connect(
        info["host"], info["port"], username=info["user"], client_keys=[client_key], known_hosts=known
    ) as connection:
        async with connection.start_sftp_client() as sftp:
            async with sftp.open("/grow", "wb+") as handle:
                await handle.write(b"x" * SIZE)
                with pytest.raises(asyncssh.SFTPFailure, match="never end"):
                    await asyncio.wait_for(sftp.remote_copy(handle, handle, 0, 0, SIZE), 30)
                with pytest.raises(asyncssh.SFTPFailure, match="never end"):  # two handles, one file
                    async with sftp.open("/grow", "rb") as reader:
                        await asyncio.wait_for(sftp.remote_copy(reader, handle, 0, 0, 10), 30)
                await asyncio.wait_for(sftp.remote_copy(handle, handle, 1000, 100, 0), 30)  # backward: served
            assert (await sftp.stat("/grow")).size == SIZE, "the file is as it was"
            await asyncio.wait_for(sftp.remote_copy("/grow", "/copy"), 30)
            assert (await sftp.stat("/copy")).size == SIZE
