"""SSH into a rental's containers, end to end, with OpenSSH's own ssh, scp and sftp.

The stack runs the offline busybox image: no sshd, no scp, no sftp-server in
it. The renter's client reaches the local marketplace's loopback endpoint, the
bytes travel the agent's channel, and the agent's own SSH server (asyncssh)
runs sessions as Docker execs and file transfers through a helper confined to
the container.
"""

from __future__ import annotations

import asyncio
import hashlib
import shlex
import subprocess
import uuid

from support.openapi_check import check_named
from support.ssh_clients import Endpoint, PtySsh, fingerprint, free_port, make_key, ssh_ready
from support.stacks import TEST_IMAGE
from support.waiting import until

from gpuhost_agent.local_marketplace.channel_hub import StreamRefused, close_quietly
from gpuhost_agent.protocol import wire

STACK = f"""
services:
  shell:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "mkdir -p /tmp && echo container-shadow > /etc/shadow && exec sleep 100000"]
    stop_grace_period: 1s
  web:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "mkdir -p /www && echo hello over ssh -L > /www/index.html && exec httpd -f -p 8080 -h /www"]
    expose: ["8080"]
    stop_grace_period: 1s
"""


async def _deploy(renter, content: str, **flags: bool) -> tuple[str, str]:
    rental_id = await renter.rental()
    stack_id = await renter.stack(rental_id, content, name="ssh", **flags)
    stack = await renter.wait_stack(rental_id, stack_id, (wire.APPLIED, wire.ERROR), timeout=60)
    assert stack["status"] == wire.APPLIED, stack["errorMsg"]
    return rental_id, stack_id


async def _read(path) -> bytes:
    return await asyncio.to_thread(path.read_bytes)


async def _add_key(renter, public_line: str) -> None:
    status, body = await renter.call("POST", "/users/ssh-key", {"publicKey": public_line})
    assert status == 200, body


async def test_sessions_files_and_forwarding(local_market, local_doc, tmp_path):
    renter, _parts, _local = local_market
    key, later, stranger = (tmp_path / "renter", tmp_path / "later", tmp_path / "stranger")
    await _add_key(renter, await asyncio.to_thread(make_key, key))
    later_line = await asyncio.to_thread(make_key, later)
    await asyncio.to_thread(make_key, stranger)
    rental_id, stack_id = await _deploy(renter, STACK, isSSHEnabled=True)
    tunnels = {t["service"]: t for t in await renter.tunnels(rental_id, stack_id, 2, ssh_ready, timeout=30)}
    for tunnel in tunnels.values():
        check_named(local_doc, tunnel, "Tunnel")
    info = tunnels["shell"]["ssh"]
    assert info["user"] == f"shell.{stack_id[:8]}" and info["command"].startswith("ssh -i ")
    assert f" -p {info['port']} " in info["command"] and info["command"].endswith(f"{info['user']}@{info['host']}")
    # The command as pasted, the renter's key in place of ssh-keygen's default file: OpenSSH
    # accepts the host key it pins, with no known_hosts of the renter's to read.
    pasted = info["command"].replace("~/.ssh/id_ed25519", shlex.quote(str(key)), 1)
    pasted = pasted.replace("ssh ", "ssh -o BatchMode=yes -o UserKnownHostsFile=/dev/null ", 1) + " echo pinned"
    done = await asyncio.to_thread(subprocess.run, ["bash", "-c", pasted], capture_output=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, b"pinned\n"), done.stderr
    assert info["hostKeyFingerprint"] == await asyncio.to_thread(fingerprint, info["hostKey"], tmp_path)
    end = await asyncio.to_thread(Endpoint, info["host"], info["port"], info["hostKey"], tmp_path)
    user = info["user"]

    # A command: its exit status, stdout and stderr apart, stdin to EOF, the client's environment
    done = await asyncio.to_thread(end.ssh, key, user, "echo out; echo err >&2; exit 7")
    assert (done.returncode, done.stdout, done.stderr) == (7, b"out\n", b"err\n")
    done = await asyncio.to_thread(end.ssh, key, user, "wc -c", stdin=b"x" * 100_000)
    assert done.returncode == 0 and done.stdout.split() == [b"100000"], done
    done = await asyncio.to_thread(end.ssh, key, user, "echo $GREETING", options=("-o", "SetEnv=GREETING=hello"))
    assert done.stdout == b"hello\n", done
    # OpenSSH's default choice, chacha20-poly1305, is not offered: AES is faster in asyncssh
    done = await asyncio.to_thread(end.ssh, key, user, "true", options=("-v",))
    chosen = [line for line in done.stderr.decode().splitlines() if "server->client cipher:" in line]
    assert chosen and "chacha20" not in chosen[0] and "aes" in chosen[0], chosen or done.stderr[-500:]
    # No DSA: neither as the host's key nor among the signatures a login may use (server-sig-algs)
    done = await asyncio.to_thread(end.ssh, key, user, "true", options=("-vv",))
    said = done.stderr.decode().splitlines()
    offered = [line for line in said if "host key algorithms:" in line or "server-sig-algs=" in line]
    assert len(offered) >= 2 and any("ssh-ed25519" in line for line in offered), said[-40:]
    assert not [line for line in offered if "ssh-dss" in line], offered

    # A shell on a PTY: the window size, a resize, the exit status
    terminal = await asyncio.to_thread(PtySsh, end, key, user, 30, 100)
    await asyncio.to_thread(terminal.type, "stty size\n")
    await asyncio.to_thread(terminal.until, b"30 100")
    await asyncio.to_thread(terminal.resize, 40, 120)
    await asyncio.sleep(0.3)
    await asyncio.to_thread(terminal.type, "stty size\n")
    await asyncio.to_thread(terminal.until, b"40 120")
    await asyncio.to_thread(terminal.type, "exit 3\n")
    assert await asyncio.to_thread(terminal.close) == 3

    # scp both ways (SFTP underneath), legacy scp, and sftp, in an image without SSH tools
    payload = uuid.uuid4().bytes * 40_000  # 640 KB
    await asyncio.to_thread((tmp_path / "up.bin").write_bytes, payload)
    done = await asyncio.to_thread(end.scp, key, str(tmp_path / "up.bin"), end.remote(user, "/tmp/up.bin"))
    assert done.returncode == 0, done.stderr
    done = await asyncio.to_thread(end.scp, key, end.remote(user, "/tmp/up.bin"), str(tmp_path / "down.bin"))
    assert done.returncode == 0 and await _read(tmp_path / "down.bin") == payload, done.stderr
    done = await asyncio.to_thread(end.scp, key, "-O", end.remote(user, "/tmp/up.bin"), str(tmp_path / "legacy.bin"))
    assert done.returncode == 0 and await _read(tmp_path / "legacy.bin") == payload, done.stderr
    done = await asyncio.to_thread(end.ssh, key, user, "md5sum < /tmp/up.bin")
    assert done.stdout.split()[0].decode() == hashlib.md5(payload).hexdigest()
    done = await asyncio.to_thread(end.sftp, key, user, "mkdir /tmp/made\nls -la /tmp\n")
    assert done.returncode == 0 and b"up.bin" in done.stdout and b"made" in done.stdout, done

    # A symlink to /etc/shadow reads the container's file, and a host path is not there at all
    host_only = tmp_path / f"host-only-{uuid.uuid4().hex}"
    await asyncio.to_thread(host_only.write_text, "host secret\n")
    await asyncio.to_thread(end.ssh, key, user, f"ln -s /etc/shadow /tmp/escape; ln -s {host_only} /tmp/host")
    done = await asyncio.to_thread(end.scp, key, end.remote(user, "/tmp/escape"), str(tmp_path / "escape"))
    assert done.returncode == 0 and await _read(tmp_path / "escape") == b"container-shadow\n", done.stderr
    done = await asyncio.to_thread(end.scp, key, end.remote(user, "/tmp/host"), str(tmp_path / "host"))
    assert done.returncode != 0 and not await asyncio.to_thread((tmp_path / "host").exists)

    # -L to a sibling service of the stack; refused: an undeclared port, a port nothing listens on in the
    # container's own loopback (tests/integration/test_ssh_loopback.py), the host, anything outside
    port = free_port()
    forward = await asyncio.to_thread(
        subprocess.Popen,
        ["ssh", *end.options(key), "-p", str(end.port), "-N", "-L", f"127.0.0.1:{port}:web:8080", f"{user}@{end.host}"],
    )
    try:
        for _ in range(40):
            done = await asyncio.to_thread(
                subprocess.run, ["curl", "-sS", "--max-time", "5", f"http://127.0.0.1:{port}/"], capture_output=True
            )
            if done.returncode == 0:
                break
            await asyncio.sleep(0.25)
        assert done.stdout == b"hello over ssh -L\n", done
    finally:
        forward.terminate()
        await asyncio.to_thread(forward.wait, 10)
    for target in ("web:9999", "127.0.0.1:22", "172.17.0.1:2375", "example.org:80"):
        done = await asyncio.to_thread(end.ssh, key, user, options=("-W", target))
        assert done.returncode != 0 and b"open failed" in done.stderr, (target, done)

    # Keys: a stranger's is refused, one the renter adds later works without a redeploy
    done = await asyncio.to_thread(end.ssh, stranger, user, "true")
    assert done.returncode == 255 and b"Permission denied" in done.stderr
    done = await asyncio.to_thread(end.ssh, later, user, "true")
    assert done.returncode == 255
    await _add_key(renter, later_line)
    for _ in range(40):
        done = await asyncio.to_thread(end.ssh, later, user, "echo in")
        if done.returncode == 0:
            break
        await asyncio.sleep(0.25)
    assert done.stdout == b"in\n", done

    # A login name of no service of this stack: the renter's key passes, then the agent says there is none;
    # a key query alone (PK_OK, no signature) tells nothing of which services run
    done = await asyncio.to_thread(end.ssh, key, f"nosuch.{stack_id[:8]}", "true")
    assert done.returncode == 255 and b"no running container of service 'nosuch'" in done.stderr, done.stderr
    public_only = tmp_path / "public-only"  # the renter's public key, and no private one: only a key query
    await asyncio.to_thread(lambda: public_only.write_bytes((tmp_path / "renter.pub").read_bytes()))
    said = {}
    for name in ("shell", "nosuch"):
        done = await asyncio.to_thread(end.ssh, public_only, f"{name}.{stack_id[:8]}", "true", options=("-vv",))
        said[name] = [line for line in done.stderr.decode().splitlines() if "Server accepts key" in line]
    assert said["shell"] and said["nosuch"], said  # PK_OK for both: the query says nothing of what runs


async def test_ssh_only_where_the_template_asks(local_market, tmp_path):
    renter, _parts, local = local_market
    await _add_key(renter, await asyncio.to_thread(make_key, tmp_path / "renter"))
    plain_rental, plain_stack = await _deploy(renter, STACK)
    ssh_rental, ssh_stack = await _deploy(renter, STACK, isSSHEnabled=True)
    await renter.tunnels(ssh_rental, ssh_stack, 2, ssh_ready, timeout=30)
    stack = next(s for s in await renter.stacks(plain_rental) if s["stackId"] == plain_stack)
    assert [t for t in stack["tunnels"] if t["protocol"] == "ssh"] == []

    # The agent itself refuses an ssh stream to a stack without SSH, or under another rental
    hub = local.state.streams
    for rental_id, stack_id in ((plain_rental, plain_stack), (plain_rental, ssh_stack)):
        try:
            await hub.open("ssh", rental_id, {"stackId": stack_id})
            raise AssertionError("the agent opened an ssh stream it should refuse")
        except StreamRefused as refused:
            assert refused.status == 404, refused.message


async def test_the_channel_drops_and_comes_back(local_market, tmp_path):
    """An open SSH session lives on its own stream and outlasts the channel; new
    SSH logins and tunnel requests work again once the agent reopened it."""
    renter, parts, local = local_market
    key = tmp_path / "renter"
    await _add_key(renter, await asyncio.to_thread(make_key, key))
    rental_id, stack_id = await _deploy(renter, STACK, isSSHEnabled=True)
    info = next(
        t for t in await renter.tunnels(rental_id, stack_id, 2, ssh_ready, timeout=30) if t["service"] == "shell"
    )["ssh"]
    end = await asyncio.to_thread(Endpoint, info["host"], info["port"], info["hostKey"], tmp_path)
    stack = next(s for s in await renter.stacks(rental_id) if s["stackId"] == stack_id)
    web = next(t for t in stack["tunnels"] if t["protocol"] == "http")

    terminal = await asyncio.to_thread(PtySsh, end, key, info["user"], 24, 80)
    await asyncio.to_thread(terminal.type, "echo before-$((6*7))\n")
    await asyncio.to_thread(terminal.until, b"before-42")

    hub = local.state.streams
    await close_quietly(hub.channel)  # what a network blip does to the channel
    await until(lambda: not parts.streams.connected.is_set())
    await asyncio.to_thread(terminal.type, "echo during-$((6*7))\n")
    await asyncio.to_thread(terminal.until, b"during-42")  # the session's own stream is untouched

    await asyncio.wait_for(parts.streams.connected.wait(), 15)
    done = await asyncio.to_thread(end.ssh, key, info["user"], "echo again")
    assert done.stdout == b"again\n", done
    curl = await asyncio.to_thread(
        subprocess.run, ["curl", "-sS", "--max-time", "10", web["url"]], capture_output=True, timeout=20
    )
    assert curl.stdout == b"hello over ssh -L\n", curl
    await asyncio.to_thread(terminal.type, "exit\n")
    assert await asyncio.to_thread(terminal.close) == 0
