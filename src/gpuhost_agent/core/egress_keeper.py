"""Keeps the host's egress rules in place (runtime/egress_rules.py says which).

At start and then every minute the agent compares the host's packet filter
with its rules and writes back whatever differs: a firewall reload, an
operator's `iptables -F` or a rule deleted by hand is undone within a
minute, and said in the log. The rules stay when the agent stops (a rental's
containers keep running without it); `gpuhost-agent egress remove` (run by
install.sh --uninstall) takes them away.
"""

from __future__ import annotations

import asyncio

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.runtime.egress_rules import Opening
from gpuhost_agent.runtime.host_firewall import Difference, FirewallError, HostFirewall

log = get_logger(__name__)

CHECK_SECONDS = 60.0


class EgressKeeper:
    def __init__(
        self,
        firewall: HostFirewall,
        allowed: tuple[str, ...],
        interval: float = CHECK_SECONDS,
        openings: tuple[Opening, ...] = (),
    ):
        """`openings`: what the engine fence lets dockerd and the agent reach on the host."""
        self.firewall = firewall
        self.allowed = allowed
        self.openings = openings
        self.interval = interval
        self.problem: str | None = None  # why the rules are not in place, as last found
        self._checked = False
        self._gap: str | None = None

    async def run_once(self) -> None:
        try:
            found = await asyncio.to_thread(self._ensure)
        except FirewallError as exc:
            if str(exc) != self.problem:
                log.error("egress_not_confined", reason=str(exc), hint="a rental's containers can reach the host")
            self.problem = str(exc)
            return
        if self.problem:
            log.info("egress_confined", was=self.problem)
        elif found and self._checked:
            log.warning("egress_rules_restored", differed=found.said(), allowed=list(self.allowed))
        elif found:
            log.info("egress_rules_installed", allowed=list(self.allowed))
        self.problem = None
        self._checked = True
        gap = await asyncio.to_thread(self.firewall.ipv6_gap)
        if gap and gap != self._gap:  # IPv4's rules hold; IPv6's cannot be written here
            log.error("egress_not_confined", reason=gap, hint="IPv4's rules are in place")
        self._gap = gap

    def _ensure(self) -> Difference:
        return self.firewall.ensure(self.firewall.wanted(self.allowed, self.openings))
