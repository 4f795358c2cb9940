"""The host's packet filter: the one adapter to iptables and ip6tables.

The agent's rules (runtime/egress_rules.py) live in chains of its own, each
written whole in one `iptables-restore --noflush` transaction, so no packet
ever meets a half-written chain; a jump at the head of DOCKER-USER (or
FORWARD, where the engine keeps no iptables rules of its own) and of INPUT
sends a rental's traffic into them. The `iptables` on PATH is the one the
engine uses, whichever backend it drives (nftables or legacy).

What is in place is read rule by rule with `-C`, which compares rules as
the kernel holds them whatever their spelling, and the chain's length: a
rule added or removed by hand is seen as a difference and the chain is
written again.
"""

from __future__ import annotations

import grp
import ipaddress
import shlex
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from gpuhost_agent.errors import OutsideFailure
from gpuhost_agent.runtime.egress_rules import (
    DOCKER_USER,
    ENGINE_CHAIN,
    ENGINE_GROUP,
    FORWARD_CHAIN,
    GUARD_CHAIN,
    HOST_CHAIN,
    Jump,
    Opening,
    Rule,
    engine_jumps,
    engine_rules,
    forward_rules,
    guard_jumps,
    guard_rules,
    host_rules,
    jumps,
    nameservers_of,
)

TOOLS_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TIMEOUT_SECONDS = 30
# The engine forwards a container's DNS queries to the host's nameservers, or
# to systemd-resolved's upstreams when the host's own is a loopback stub.
RESOLV_CONFS = (Path("/etc/resolv.conf"), Path("/run/systemd/resolve/resolv.conf"))
IPV6_ADDRESSES = Path("/proc/net/if_inet6")  # there when the kernel has IPv6


class FirewallError(OutsideFailure):
    """iptables is missing, or refused a command (its own words)."""


@dataclass(frozen=True)
class Difference:
    """What the host's rules lack against what the agent wants: empty when confined."""

    chains: tuple[str, ...]  # "iptables GPUHOST-EGRESS": missing or not as written
    jumps: tuple[str, ...]  # "iptables INPUT -> GPUHOST-HOST": missing, or not the chain's first rule

    def __bool__(self) -> bool:
        return bool(self.chains or self.jumps)

    def said(self) -> str:
        jumps = (f"no jump {jump} first" for jump in self.jumps)
        return "; ".join([*(f"chain {chain} differs" for chain in self.chains), *jumps])


class HostFirewall:
    def __init__(
        self, path: str = TOOLS_PATH, resolv_confs: tuple[Path, ...] = RESOLV_CONFS, group: str = ENGINE_GROUP
    ):
        """`group`: the engine fence's group; where the host has none (install.sh makes it), no fence."""
        self.path = path
        self.resolv_confs = resolv_confs
        self.group = group

    def engine_gid(self) -> int | None:
        """The fence's group id, or None where the host has no such group."""
        try:
            return grp.getgrnam(self.group).gr_gid
        except KeyError:
            return None

    def wanted(self, allowed: tuple[str, ...], openings: tuple[Opening, ...] = ()) -> list[Rule]:
        """The rules for this host now, its nameservers read; the pull guard's
        door, and the engine fence with `openings` where the host has its
        group (each opening's name resolved now). Blocking."""
        servers: list[str] = []
        for path in self.resolv_confs:
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            servers += [server for server in nameservers_of(text) if server not in servers]
        resolved = {opening: _addresses(opening.host) for opening in openings}
        guards = tuple((address, o.port) for o in openings if o.guard for address in resolved[o])
        fence = []
        if self.engine_gid() is not None:
            opened = tuple(dict.fromkeys((a, o.port) for o in openings for a in resolved[o]))
            fence = engine_rules(opened, tuple(servers))
        return forward_rules(allowed, tuple(servers)) + host_rules() + fence + guard_rules(guards)

    def facts(self, allowed: tuple[str, ...], openings: tuple[Opening, ...] = ()) -> dict:
        """What the host probe reports: are a rental's containers confined now? Blocking."""
        if problem := self.problem():
            return {"confined": False, "differs": None, "error": problem}
        try:
            found = self.difference(self.wanted(allowed, openings))
        except FirewallError as exc:
            return {"confined": None, "differs": None, "error": str(exc)}
        if gap := self.ipv6_gap():
            return {"confined": False, "differs": found.said() or None, "error": gap}
        return {"confined": not found, "differs": found.said() or None, "error": None}

    def problem(self) -> str | None:
        """Why the rules cannot be kept here, or None."""
        for tool in ("iptables", "iptables-restore"):
            if not shutil.which(tool, path=self.path):
                return f"{tool} is not installed: a rental's containers can reach the host and its networks"
        return None

    def ipv6_gap(self) -> str | None:
        """Why the host's IPv6 side is not held though IPv4's is, or None: a kernel
        with IPv6 and no ip6tables (IPv4's rules are written all the same)."""
        if not IPV6_ADDRESSES.exists() or self._has_ip6tables():
            return None
        return "ip6tables is not installed: a rental's containers can reach the host over IPv6 (apt install iptables)"

    def working(self, rules: list[Rule]) -> list[Rule]:
        """`rules` less those of ip6tables on a kernel without IPv6 (no filter
        table to write to, and no IPv6 address to reach the host by) or where
        ip6tables is missing (ipv6_gap says so)."""
        return rules if self._ipv6() else [rule for rule in rules if rule.tool != "ip6tables"]

    def difference(self, rules: list[Rule], *, before_engine: bool = False) -> Difference:
        """Compare the host's chains and jumps with `rules`. Blocking: run in a thread."""
        self._check()
        rules = self.working(rules)
        chains = []
        for (tool, chain), wanted in _by_chain(rules).items():
            listed = self._run(tool, "-S", chain, check=False)
            if listed.returncode != 0:
                chains.append(f"{tool} {chain}")
                continue
            present = [line for line in listed.stdout.splitlines() if line.startswith("-A ")]
            if len(present) != len(wanted) or not all(self._has(tool, rule.chain, rule.args) for rule in wanted):
                chains.append(f"{tool} {chain}")
        tools = {rule.tool for rule in rules}
        wanted_jumps = [jump for jump in self._jumps(before_engine, rules) if jump.tool in tools]
        missing = [jump.label for jump in wanted_jumps if not self._at_head(jump, _heads(wanted_jumps)[_parent(jump)])]
        return Difference(tuple(chains), tuple(missing))

    def _at_head(self, jump: Jump, count: int) -> bool:
        """Is `jump` among the first `count` rules of its parent chain (as many as
        the agent keeps there)? A rule above it (an ACCEPT of another tool's)
        would decide before the agent's."""
        listed = self._run(jump.tool, "-S", jump.parent, check=False).stdout.splitlines()
        rules = [line for line in listed if line.startswith("-A ")]
        return f"-A {jump.parent} {' '.join(jump.args)}" in rules[:count]

    def ensure(self, rules: list[Rule], *, before_engine: bool = False) -> Difference:
        """Put the rules in place where they differ; what differed (empty: nothing
        was done). Blocking: run in a thread. `before_engine`: at boot, before
        dockerd starts (its unit's ExecStartPre, written by install.sh): DOCKER-USER
        is made for the engine to find, so the rules hold from the first container
        it starts again."""
        if before_engine and not self._chain_exists("iptables", DOCKER_USER):
            self._run("iptables", "-N", DOCKER_USER)
        found = self.difference(rules, before_engine=before_engine)
        # Each chain and each parent's jumps on their own, the rentals' first, OUTPUT's (the fence, the
        # guard's door) last, always in one order: one that cannot be written (a kernel without the owner
        # match) leaves the others written, and is raised at the end.
        failed: list[FirewallError] = []
        for (tool, chain), wanted in _by_chain(rules).items():
            if f"{tool} {chain}" in found.chains:
                try:
                    self._restore(tool, chain, wanted)
                except FirewallError as exc:
                    failed.append(exc)
        all_jumps = self._jumps(before_engine, self.working(rules))
        differing = {_parent(jump) for jump in all_jumps if jump.label in found.jumps}
        for parent in sorted(differing, key=lambda pair: (pair[1] == "OUTPUT", pair)):
            ours = [jump for jump in all_jumps if _parent(jump) == parent]
            try:
                for jump in ours:  # every one of the parent's, present or not, moved to the head together
                    while self._has(jump.tool, jump.parent, jump.args):
                        self._run(jump.tool, "-D", jump.parent, *jump.args)
                for position, jump in enumerate(ours, start=1):
                    self._run(jump.tool, "-I", jump.parent, str(position), *jump.args)
            except FirewallError as exc:
                failed.append(exc)
        if failed:
            raise failed[0]
        return found

    def remove(self) -> list[str]:
        """Take every rule of the agent's away (uninstall); what was removed.
        Without iptables there is nothing of the agent's to remove."""
        if not shutil.which("iptables", path=self.path):
            return []
        tools = ["iptables"]
        if shutil.which("ip6tables", path=self.path) and self._ipv6():
            tools.append("ip6tables")
        removed = []
        for jump in jumps(True) + jumps(False):
            while jump.tool in tools and self._has(jump.tool, jump.parent, jump.args):
                self._run(jump.tool, "-D", jump.parent, *jump.args)
                removed.append(jump.label)
        for tool in tools:  # the fence's jumps, whatever group id they name (the group may be gone)
            for line in self._run(tool, "-S", "OUTPUT", check=False).stdout.splitlines():
                if line.startswith("-A OUTPUT ") and line.endswith((f" -j {ENGINE_CHAIN}", f" -j {GUARD_CHAIN}")):
                    self._run(tool, "-D", "OUTPUT", *shlex.split(line)[2:])
                    removed.append(f"{tool} OUTPUT -> {line.rsplit(' ', 1)[1]}")
        chains = (("iptables", FORWARD_CHAIN), ("iptables", HOST_CHAIN), ("ip6tables", HOST_CHAIN))
        ours = ((tool, chain) for tool in ("iptables", "ip6tables") for chain in (ENGINE_CHAIN, GUARD_CHAIN))
        for tool, chain in (*chains, *ours):
            if tool in tools and self._chain_exists(tool, chain):
                self._run(tool, "-F", chain)
                self._run(tool, "-X", chain)
                removed.append(f"{tool} {chain}")
        return removed

    def _jumps(self, before_engine: bool, rules: list[Rule]) -> list[Jump]:
        """From DOCKER-USER where the engine sends FORWARD's traffic through it
        (or will: before_engine), else from FORWARD itself (an engine without
        iptables rules of its own)."""
        gid = self.engine_gid()
        chains = {(rule.tool, rule.chain) for rule in rules}
        fence = [j for j in engine_jumps(gid) if (j.tool, j.chain) in chains] if gid is not None else []
        fence += guard_jumps({tool for tool, chain in chains if chain == GUARD_CHAIN})
        if before_engine:  # and from FORWARD too: an engine may never send traffic through DOCKER-USER
            return [*jumps(True), *(jump for jump in jumps(False) if jump.parent == "FORWARD"), *fence]
        if not self._chain_exists("iptables", DOCKER_USER):
            return jumps(False) + fence
        return jumps(self._has("iptables", "FORWARD", ("-j", DOCKER_USER))) + fence

    def _ipv6(self) -> bool:
        """Does the kernel have IPv6's filter table (not so without IPv6), and ip6tables to write it?"""
        return self._has_ip6tables() and self._chain_exists("ip6tables", "INPUT")

    def _has_ip6tables(self) -> bool:
        return all(shutil.which(tool, path=self.path) for tool in ("ip6tables", "ip6tables-restore"))

    def _chain_exists(self, tool: str, chain: str) -> bool:
        return self._run(tool, "-S", chain, check=False).returncode == 0

    def _check(self) -> None:
        if problem := self.problem():
            raise FirewallError(problem)

    def _has(self, tool: str, chain: str, args: tuple[str, ...]) -> bool:
        return self._run(tool, "-C", chain, *args, check=False).returncode == 0

    def _restore(self, tool: str, chain: str, rules: list[Rule]) -> None:
        """The chain made (or emptied) and written in one transaction."""
        lines = ["*filter", f":{chain} - [0:0]", *(f"-A {chain} {' '.join(rule.args)}" for rule in rules), "COMMIT", ""]
        self._run(f"{tool}-restore", "--noflush", "-w", stdin="\n".join(lines), table=False)

    def _run(
        self, tool: str, *args: str, check: bool = True, stdin: str | None = None, table: bool = True
    ) -> subprocess.CompletedProcess:
        program = shutil.which(tool, path=self.path)
        if not program:
            raise FirewallError(f"{tool} is not installed")
        command = [program, *(("-w", "-t", "filter") if table else ()), *args]
        try:
            done = subprocess.run(
                command,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_SECONDS,
                env={"PATH": self.path, "LC_ALL": "C"},
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise FirewallError(f"{tool} {' '.join(args[:2])} did not finish within {TIMEOUT_SECONDS} s") from None
        if check and done.returncode != 0:
            raise FirewallError(f"{tool} {' '.join(args[:2])} failed: {done.stderr.strip()[:300]}")
        return done


RESOLVED_SECONDS = 600.0  # a name's answer kept this long: a round-robin name rewrites no chain each minute
_resolved: dict[str, tuple[float, tuple[str, ...]]] = {}


def _addresses(host: str) -> tuple[str, ...]:
    """An opening's addresses: itself when it is one, else what the resolver
    answered (the operator's own names: a registry, a proxy), sorted and kept
    RESOLVED_SECONDS, none when it answers nothing."""
    try:
        return (str(ipaddress.ip_address(host.strip("[]"))),)
    except ValueError:
        pass
    kept = _resolved.get(host)
    if kept and time.monotonic() - kept[0] < RESOLVED_SECONDS:
        return kept[1]
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        found = tuple(sorted({str(info[4][0]).split("%")[0] for info in infos}))
    except (OSError, UnicodeError):
        found = ()
    _resolved[host] = (time.monotonic(), found)
    return found


def _parent(jump: Jump) -> tuple[str, str]:
    return (jump.tool, jump.parent)


def _heads(jumps_kept: list[Jump]) -> dict[tuple[str, str], int]:
    """How many of the agent's jumps each parent chain starts with."""
    counts: dict[tuple[str, str], int] = {}
    for jump in jumps_kept:
        counts[_parent(jump)] = counts.get(_parent(jump), 0) + 1
    return counts


def _by_chain(rules: list[Rule]) -> dict[tuple[str, str], list[Rule]]:
    """The rules of each (tool, chain), in the order they come."""
    chains: dict[tuple[str, str], list[Rule]] = {}
    for rule in rules:
        chains.setdefault((rule.tool, rule.chain), []).append(rule)
    return chains
