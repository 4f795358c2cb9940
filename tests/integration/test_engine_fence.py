"""The engine fence (runtime/egress_rules.py) on this machine's
real kernel, in a network namespace of the test's own: Go's proxy choice never
sends a loopback target to the pull guard, so a registry's redirect or token
realm naming 127.0.0.1 reached the host's services from dockerd. The agent's
own HostFirewall writes the fence; a process in the fence's group (as dockerd
and the agent are, by install.sh's drop-ins) may reach the guard's port and
nothing else of the host, another process anything; replies to connections
made to a member still go out.

A group that exists here stands for gpuhost-engine (the test does not make
groups on this machine). Needs root (namespaces, iptables).
"""

from __future__ import annotations

import grp
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GROUP = "daemon"  # stands for gpuhost-engine
PROBE = r"""
import json, socket, subprocess, sys, threading
gid = sys.argv[1]

def listen(address, port):
    server = socket.create_server((address, port))
    def serve():
        while True:
            conn, _ = server.accept()
            conn.sendall(b"hello")
            conn.close()
    threading.Thread(target=serve, daemon=True).start()

for port in (47128, 5999):
    listen("0.0.0.0", port)

CLIENT = ("import socket, sys; s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3); "
          "print(s.recv(5).decode())")
def reaches(address, port, member, user=None):
    groups = [f"--groups={gid}"] if member else ["--clear-groups"]
    who = [f"--reuid={user}", f"--regid={user}"] if user else []
    done = subprocess.run(["setpriv", *who, *groups, "--", sys.executable, "-c", CLIENT, address, str(port)],
                          capture_output=True, text=True, timeout=20)
    return done.stdout.strip() == "hello"

# A member that serves: a connection made to it is answered (its replies are no new connection).
MEMBER_SERVER = ("import socket; s = socket.create_server(('127.0.0.1', 6001)); c, _ = s.accept(); "
                 "c.sendall(b'hello'); c.close()")
served = subprocess.Popen(["setpriv", f"--groups={gid}", "--", sys.executable, "-c", MEMBER_SERVER])
import time; time.sleep(0.5)
answered = reaches("127.0.0.1", 6001, member=False)
served.wait(timeout=20)
SQUATTER = ("import socket; s = socket.create_server(('127.0.0.1', 47129)); s.settimeout(8)\n"
            "try:\n c, _ = s.accept(); c.sendall(b'hello'); c.close()\nexcept OSError: pass")
squatter = subprocess.Popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", sys.executable,
                             "-c", SQUATTER])
time.sleep(0.5)
squatted = reaches("127.0.0.1", 47129, True)
squatter.kill()
TARGETS = [(a, p) for a in ("127.0.0.1", "10.9.9.9", "169.254.169.254") for p in (47128, 5999)]
print(json.dumps({
    "member": {f"{a}:{p}": reaches(a, p, True) for a, p in TARGETS},
    "other": {f"{a}:{p}": reaches(a, p, False) for a, p in TARGETS},
    "answered": answered,
    # The guard's door: another user of the host reaches no guard, and another port still.
    "nobody": {f"127.0.0.1:{p}": reaches("127.0.0.1", p, False, user=65534) for p in (47128, 5999)},
    # Another user who took a guard's port (the agent restarting): root's clients get no connection to it.
    "squatted": squatted,
}))
"""
APPLY = (
    "from gpuhost_agent.runtime.egress_rules import Opening\n"
    "from gpuhost_agent.runtime.host_firewall import HostFirewall\n"
    f"firewall = HostFirewall(group={GROUP!r})\n"
    "guards = (Opening('127.0.0.1', 47128, guard=True), Opening('127.0.0.1', 47129, guard=True))\n"
    "print(firewall.ensure(firewall.wanted((), guards)).said())\n"
)


def _ns(namespace: str, *command: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", namespace, *command], capture_output=True, text=True, check=check)


@pytest.fixture
def namespace():
    if os.geteuid() != 0:
        pytest.skip("needs root: network namespaces and iptables")
    name = f"gh-fence-{uuid.uuid4().hex[:6]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        _ns(name, "ip", "link", "set", "lo", "up")
        _ns(name, "ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1")  # no dummy module here
        _ns(name, "ip", "addr", "add", "10.9.9.9/24", "dev", "d0")  # the host's own address
        _ns(name, "ip", "addr", "add", "169.254.169.254/32", "dev", "d0")  # a metadata service's, here
        _ns(name, "ip", "link", "set", "d0", "up")
        _ns(name, "ip", "link", "set", "d1", "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_a_member_of_the_fences_group_reaches_the_guard_and_nothing_else_of_the_host(namespace: str) -> None:
    gid = str(grp.getgrnam(GROUP).gr_gid)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    applied = subprocess.run(
        ["ip", "netns", "exec", namespace, sys.executable, "-c", APPLY], capture_output=True, text=True, env=env
    )
    assert applied.returncode == 0 and "GPUHOST-ENGINE" in applied.stdout, applied.stderr
    listed = _ns(namespace, "iptables", "-S", "OUTPUT").stdout
    assert f"-A OUTPUT -m owner --gid-owner {gid} --suppl-groups -j GPUHOST-ENGINE" in listed, listed
    probed = _ns(namespace, sys.executable, "-c", PROBE, gid)
    seen = json.loads(probed.stdout)
    assert seen["member"] == {
        "127.0.0.1:47128": True,  # the pull guard
        "127.0.0.1:5999": False,  # a service of the host's on loopback
        "10.9.9.9:47128": False,  # the guard's port, on another address than the guard's
        "10.9.9.9:5999": False,  # the host's own address
        "169.254.169.254:47128": False,
        "169.254.169.254:5999": False,
    }, seen
    assert all(seen["other"].values()), seen  # a process outside the group: untouched
    assert seen["answered"], seen  # a member's replies go out
    assert seen["nobody"] == {"127.0.0.1:47128": False, "127.0.0.1:5999": True}, seen  # the kernel
    assert seen["squatted"] is False, seen  # a squatter's answer never reaches root's client
    remove = f"from gpuhost_agent.runtime.host_firewall import HostFirewall; print(HostFirewall({GROUP=}).remove())"
    removed = subprocess.run(
        ["ip", "netns", "exec", namespace, sys.executable, "-c", remove.replace("GROUP=", "group=")],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert "GPUHOST-ENGINE" in removed.stdout and "GPUHOST-GUARD" in removed.stdout, removed.stderr
    assert "GPUHOST-" not in _ns(namespace, "iptables", "-S").stdout


PARTLY = (
    "from gpuhost_agent.runtime.egress_rules import Opening\n"
    "from gpuhost_agent.runtime.host_firewall import FirewallError, HostFirewall\n"
    "class NoOwnerMatch(HostFirewall):\n"
    "    def _restore(self, tool, chain, rules):\n"
    "        if chain == 'GPUHOST-GUARD':\n"
    "            raise FirewallError('iptables-restore failed: Couldn\\'t load match `owner\\'')\n"
    "        super()._restore(tool, chain, rules)\n"
    f"firewall = NoOwnerMatch(group={GROUP!r})\n"
    "try:\n"
    "    firewall.ensure(firewall.wanted((), (Opening('127.0.0.1', 47128, guard=True),)))\n"
    "except FirewallError as exc:\n"
    "    print('raised:', exc)\n"
)


def test_a_chain_that_cannot_be_written_leaves_the_rentals_rules_and_jumps_written(namespace: str) -> None:
    """A kernel without the owner match failed the guard's chain, and ensure stopped before any
    jump: the rentals were left unconfined. Each chain and each parent's jumps are written on their own."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        ["ip", "netns", "exec", namespace, sys.executable, "-c", PARTLY], capture_output=True, text=True, env=env
    )
    assert "raised: iptables-restore failed" in done.stdout, done.stdout + done.stderr
    assert "-A INPUT -i gpuh+ -j GPUHOST-HOST" in _ns(namespace, "iptables", "-S", "INPUT").stdout
    assert "-j GPUHOST-EGRESS" in _ns(namespace, "iptables", "-S", "FORWARD").stdout
    assert "-A GPUHOST-ENGINE -o lo -j REJECT" in _ns(namespace, "iptables", "-S", "GPUHOST-ENGINE").stdout
