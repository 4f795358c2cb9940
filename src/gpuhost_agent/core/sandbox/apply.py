"""The sandbox around one stack deploy: the safe rewrites, the pure policy,
the rental's GPUs and share of the machine, and the hardened model that
Compose will run.

The renter hears every problem of the file at once: what the raw pass took
out before Compose read the file (sandbox_raw), what the rewrites could not
make safe (sandbox_rewrite), and what the policy refuses (sandbox_policy), in
one message. What was rewritten comes back as notices.

The GPU decision is made and recorded without an `await` in between (plan,
check, commit), and only once the stack passes, so two rentals deploying at
once can never be given the same GPU, and a refused stack takes none.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.core.compose_values import problems_said
from gpuhost_agent.core.gpus.allocation import GpuSlot, NotEnoughGpus, slots_from_facts, slots_from_inventory
from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.core.rentals.disk_share import disk_share
from gpuhost_agent.core.rentals.shares import RentalShares
from gpuhost_agent.core.sandbox.context import (
    HOOK_DELIVERY,
    Registries,
    SandboxContext,
    StackSite,
    disk_floor_problem,
    machine_of,
    rental_share,
)
from gpuhost_agent.core.sandbox.harden import harden
from gpuhost_agent.core.sandbox.host_network import Absent, resolve_registries
from gpuhost_agent.core.sandbox.make_safe import rewrite
from gpuhost_agent.core.sandbox.placement import Placement
from gpuhost_agent.core.sandbox.policy import policy_violations
from gpuhost_agent.core.sandbox.raw import RawReview, review
from gpuhost_agent.core.stack_errors import StackRejected
from gpuhost_agent.inventory.host_probe import storage
from gpuhost_agent.inventory.machines import storage_total
from gpuhost_agent.protocol import wire_jobs
from gpuhost_agent.protocol.wire_system import SystemData
from gpuhost_agent.runtime.rental_cgroups import CgroupError, RentalLimits
from gpuhost_agent.streams.tunnel import read_host_networks

log = get_logger(__name__)
GPU_FAULT_PREFIX = "out of service: GPU "  # core/stacks/gpu_faults.py writes it; kept like the sandbox's changes
RELEASE_WAIT_SECONDS = 120.0  # how long a deploy waits for GPUs an ending rental still holds

POLICY_PREFIX = "refused by the sandbox policy: "
MachineFacts = Callable[[], Awaitable[SystemData]]


def review_raw(content: str, profiles: str = "") -> RawReview:
    """The file Compose may read, with what was taken out of it; StackRejected
    when it is not YAML that Compose and this parser read alike."""
    try:
        return review(content, profiles)
    except ValueError as exc:
        raise StackRejected(f"invalid Compose file: {exc}") from None


def refuse_with_compose_error(raw: RawReview, compose_error: str) -> StackRejected:
    """Compose could not read the rest of the file: its error, after the raw pass's problems."""
    if raw.problems:
        return StackRejected(f"{POLICY_PREFIX}{problems_said(raw.problems)}; and Compose says: {compose_error}")
    return StackRejected(f"invalid Compose file: {compose_error}")


CHANGES_PREFIX = "deployed with changes by the sandbox: "
WARNINGS_PREFIX = "deployed with Compose's warnings: "
COMPOSE_WARNS = "Compose warns: "  # a notice that is Compose's word, not a change the sandbox made


def notices_message(notices: list[str]) -> str:
    """An APPLIED stack's errorMsg: what the sandbox changed in the file, then
    what Compose warned of (an undefined variable...), each said apart; or ""."""
    warnings = [notice.removeprefix(COMPOSE_WARNS) for notice in notices if notice.startswith(COMPOSE_WARNS)]
    changes = [notice for notice in notices if not notice.startswith(COMPOSE_WARNS)]
    told = ((CHANGES_PREFIX, changes), (WARNINGS_PREFIX, warnings))
    return "; ".join(prefix + problems_said(said) for prefix, said in told if said)  # bounded: problems_said


def kept_notes(error_msg: str) -> str:
    """The part of an APPLIED stack's errorMsg that stays when a later report
    names stopped containers or clears them: a GPU taken out of service
    (core/stacks/gpu_faults.py) and what the sandbox changed."""
    prefixes = (GPU_FAULT_PREFIX, CHANGES_PREFIX, WARNINGS_PREFIX)
    starts = [at for at in (error_msg.find(prefix) for prefix in prefixes) if at >= 0]
    return error_msg[min(starts) :] if starts else ""


def decide(model: dict, raw: RawReview, ctx: SandboxContext) -> tuple[dict, list[str]]:
    """(the hardened model, notices) or StackRejected listing every problem. Pure."""
    rewritten, notices, problems = rewrite(model, ctx)
    problems = [*raw.problems, *problems, *policy_violations(rewritten, ctx)]
    if not (model.get("services") or {}) and not raw.profiled:
        problems.append("the Compose file defines no services")
    if problems:
        raise StackRejected(POLICY_PREFIX + problems_said(problems))
    said = [f"{COMPOSE_WARNS}{warning}" for warning in raw.compose_warnings]
    return harden(rewritten, ctx), [*raw.notices, *notices, *said]


@dataclass(frozen=True, kw_only=True)
class SandboxParts:
    """What the sandbox asks and acts on: `ledger` records the rentals' GPUs;
    `machine_facts` reads the machine (a systemData dict); `shares` holds each
    rental's share in a cgroup of its own (core/rentals/shares.py), or none (a
    Swarm leader: each container has the rental's limits only); `placement`
    decides where the stack's services run (core/sandbox/placement.py);
    `images_absent` says which images the engine lacks: only for those is a
    registry contacted."""

    ledger: GpuLedger
    machine_facts: MachineFacts
    shares: RentalShares
    placement: Placement
    images_absent: Absent


@dataclass(frozen=True, kw_only=True)
class SandboxRules:
    """The host's settings every stack is held to: where ports are published,
    each container's limits and logs, the disk floor and a rental's fixed disk
    share (disk_watch.py), the registries local on purpose and the private
    networks the operator opened (GPUHOST_EGRESS_ALLOW), and how long a deploy
    waits for GPUs an ending rental still holds."""

    publish_address: str
    pids_limit: int
    log_max_size: str
    log_max_files: int
    release_wait_seconds: float = RELEASE_WAIT_SECONDS
    disk_floor_bytes: int
    rental_disk_bytes: int | None
    allowed_registries: tuple[str, ...]
    opened_networks: tuple[str, ...] = ()


class Sandbox:
    def __init__(self, *, parts: SandboxParts, rules: SandboxRules):
        """Its collaborators, and the rules it holds each stack to: two parts,
        given by keyword, so the composition root says what each one is."""
        self.log_max_size, self.log_max_files = rules.log_max_size, rules.log_max_files
        self.shares, self.placement = parts.shares, parts.placement
        self.release_wait_seconds = rules.release_wait_seconds
        self.disk_floor_bytes = rules.disk_floor_bytes
        self.rental_disk_bytes = rules.rental_disk_bytes  # the host's fixed disk share per rental (disk_watch.py)
        # Registries local on purpose, and which images the engine lacks (whose registry it would contact).
        self.allowed_registries, self.images_absent = rules.allowed_registries, parts.images_absent
        # Private networks the operator opened (GPUHOST_EGRESS_ALLOW): a registry there is theirs to allow.
        self.opened = tuple(ipaddress.ip_network(net, strict=False) for net in rules.opened_networks)
        self.ledger = parts.ledger
        self.machine_facts = parts.machine_facts
        self.publish_address = rules.publish_address
        self.pids_limit = rules.pids_limit

    async def apply(
        self,
        job: wire_jobs.StackJob,
        model: dict,
        raw: RawReview,
        site: StackSite,
        waiting: Callable[[str], None] | None = None,
    ) -> tuple[dict, list[str], list[str]]:
        """(the hardened model, the rental's GPUs, notices) or StackRejected with
        every reason. `site` carries the project name and where Compose
        resolved the file's paths; the rest of the context is decided here.
        `waiting` hears why the deploy waits, when it waits for GPUs."""
        if self.ledger.is_over(job.rental_id):
            raise StackRejected("the rental has ended; its stacks cannot be deployed again")
        facts = await self.machine_facts()
        slots = slots_from_facts(facts)
        host = facts.get("host") or {}
        machine_gpus = len(slots_from_inventory(facts.get("nvml") or {}))  # a share is of one machine
        machine = machine_of(host, machine_gpus)
        if self.disk_floor_bytes:  # measured now: the last probe may be minutes old
            root = (host.get("docker") or {}).get("rootDir") or "/var/lib/docker"
            full = disk_floor_problem(await asyncio.to_thread(storage, root), self.disk_floor_bytes)
            if full:
                raise StackRejected(full)
        parent = await self.shares.parent(host.get("docker") or {}, job.rental_id)
        await self._until_released(job, slots, waiting)
        plan = await self.placement.plan(job.rental_id, site.project)
        registries = Registries(
            self.allowed_registries,
            tuple(await asyncio.to_thread(read_host_networks)),
            await resolve_registries(model, self.allowed_registries, self.images_absent),
            self.opened,
        )
        # From here to commit: no await, so the decision is atomic.
        try:
            uuids = self.ledger.plan(slots, job.rental_id, job.gpu_count)
        except NotEnoughGpus as exc:
            raise StackRejected(str(exc)) from None
        base_share = rental_share(machine, len(uuids))
        gpu_nodes = {slot.uuid: slot.machine for slot in slots}
        shares = plan.shares(facts, gpu_nodes, uuids)  # none on one machine: this machine's share is the rental's
        # The hardening caps at the largest share; where machines differ, the placement gives each its own.
        cpus = max([base_share[0], *(share[0] for share in shares.values())])
        memory = max([base_share[1], *(share[1] for share in shares.values())])
        storage_bytes = 0
        if ((host.get("docker") or {}).get("storageQuota") or {}).get("available"):
            storage_bytes = disk_share(
                storage_total(host), self.disk_floor_bytes, len(uuids), machine_gpus, self.rental_disk_bytes
            )
        delivery = ((host.get("docker") or {}).get("gpuDelivery") or {}).get("method") or HOOK_DELIVERY
        ctx = SandboxContext(
            project=site.project,
            project_dir=site.project_dir,
            home_dir=site.home_dir,
            agent_dir=site.agent_dir,
            foreign_names=site.foreign_names,
            gpu_uuids=tuple(uuids),
            cpus=cpus,
            memory_bytes=memory,
            pids_limit=self.pids_limit,
            publish_address=self.publish_address,
            log_max_size=self.log_max_size,
            log_max_files=self.log_max_files,
            cgroup_parent=parent,
            storage_bytes=storage_bytes,
            gpu_delivery=delivery,
            registries=registries,
        )
        hardened, notices = decide(model, raw, ctx)
        hardened, more = plan.place(hardened, ctx, facts, gpu_nodes, base_share, shares)
        notices = [*notices, *more]
        self.ledger.commit(job.rental_id, uuids)
        if parent:
            limits = RentalLimits(memory_bytes=memory, cpus=cpus, pids=self.pids_limit)
            try:
                await self.shares.apply(job.rental_id, limits)
            except CgroupError as exc:
                raise StackRejected(f"{exc}; nothing of the stack was started") from None
        return hardened, uuids, notices

    async def _until_released(
        self, job: wire_jobs.StackJob, slots: list[GpuSlot], waiting: Callable[[str], None] | None
    ) -> None:
        """A rental that ended a moment ago holds its GPUs while its containers
        stop (up to their stop timeout): a deploy that needs them waits for
        that release, bounded, instead of failing. Returns at once when the
        GPUs are there or no release would make them so."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.release_wait_seconds
        said = False
        while loop.time() < deadline:
            try:
                self.ledger.plan(slots, job.rental_id, job.gpu_count)
                return
            except NotEnoughGpus:
                if not self.ledger.fits_after_release(slots, job.rental_id, job.gpu_count):
                    return
            if not said and waiting is not None:
                waiting(
                    f"waiting for {job.gpu_count} GPU(s) that an ended rental is releasing "
                    f"(its containers are stopping); at most {self.release_wait_seconds:.0f} s"
                )
                said = True
            await self.ledger.wait_for_release(min(1.0, deadline - loop.time()))

    async def keep_limits(self, rental_ids: set[str]) -> None:
        """Write each rental's cgroup limits again (reconcile calls this for the
        rentals whose containers it sees): after a reboot dockerd restarts
        containers into their rental's cgroup before the agent runs, and runc
        makes it without limits. Idempotent, a few small writes per rental."""
        if not rental_ids:
            return
        facts = await self.machine_facts()
        host = facts.get("host") or {}
        machine = machine_of(host, len(slots_from_inventory(facts.get("nvml") or {})))
        for rental_id in sorted(rental_ids):
            try:
                if await self.shares.parent(host.get("docker") or {}, rental_id) is None:
                    return
                cpus, memory = rental_share(machine, len(self.ledger.assignments.get(rental_id, [])))
                limits = RentalLimits(memory_bytes=memory, cpus=cpus, pids=self.pids_limit)
                await self.shares.apply(rental_id, limits)
            except (StackRejected, CgroupError) as exc:
                log.warning("rental_limits_not_restored", rental_id=rental_id, error=str(exc))

    async def release(self, rental_id: str) -> list[str]:
        """The rental has ended and its containers are gone: its GPUs are free
        again and its cgroup goes."""
        await self.shares.remove(rental_id)
        return self.ledger.release(rental_id)
