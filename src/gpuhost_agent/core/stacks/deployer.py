"""Deploy and remove one stack, reporting every step.

The steps are the same on one machine and on a Swarm environment's leader;
how a stack starts, runs and goes is the backend's (core/stacks/backend.py:
Compose, or `docker stack`), chosen by the composition root.

A failed deploy never leaves half-started containers: whatever the backend
started is taken down before ERROR is reported, so the renter can simply try
again.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpuhost_agent.common import crash_points
from gpuhost_agent.common.logs import SECRETS, get_logger, might_be_secret
from gpuhost_agent.core.compose_values import ComposeModel, problems_said
from gpuhost_agent.core.images.pulls import FRESH_POLICIES, pullable_images
from gpuhost_agent.core.sandbox.apply import POLICY_PREFIX, Sandbox, notices_message, review_raw
from gpuhost_agent.core.sandbox.context import StackSite, crowded_rental_problem
from gpuhost_agent.core.sandbox.label_size import oversized_container
from gpuhost_agent.core.sandbox.raw import RawReview
from gpuhost_agent.core.stack_errors import StackFailed, StackRejected
from gpuhost_agent.core.stacks import naming
from gpuhost_agent.core.stacks.backend import StackBackend
from gpuhost_agent.core.stacks.container_list import failed_containers, seed_containers
from gpuhost_agent.core.stacks.deploy_cancels import DeployCancels
from gpuhost_agent.core.stacks.deploy_failures import (
    LimitReached,
    describe_container,
    pull_failure,
    service_images,
    without_registry_reply,
)
from gpuhost_agent.core.stacks.image_checks import image_problems
from gpuhost_agent.core.stacks.project_input import MAX_VARIABLES, check_variables, label_services
from gpuhost_agent.core.stacks.status_reporter import StackRef, StatusReporter
from gpuhost_agent.errors import OutsideFailure, Refusal
from gpuhost_agent.protocol import wire, wire_jobs
from gpuhost_agent.runtime.compose import COMPOSE_PROJECT_LABEL, ComposeError
from gpuhost_agent.runtime.engine.client import DockerEngine, EngineError
from gpuhost_agent.runtime.engine.records import ContainerSummary
from gpuhost_agent.storage.agent_db import AgentDB

log = get_logger(__name__)

ORIGINAL_FILE = "compose.yaml"
AGENT_FILE = "compose.agent.json"


class StackPulls(Protocol):
    """What the deployer asks of image pulls: ImagePulls on one machine
    (core/images/pulls.py), PullsElsewhere where each machine's engine pulls
    its own (core/images/pulls_elsewhere.py)."""

    @property
    def pulls_locally(self) -> bool:
        """Whether a stack's images are pulled by, and kept on, this machine's engine."""
        ...

    async def make_room(self) -> None: ...

    async def check_room(self, rental_id: str, images: list[str]) -> None: ...

    async def fetch(
        self, images: list[str], progress: Callable[[str], None], rental_id: str = ""
    ) -> dict[str, str]: ...

    async def used(self, images: list[str]) -> None: ...


@dataclass(frozen=True, kw_only=True)
class DeployParts:
    """What a deploy calls: `backend` starts, watches and takes down stacks
    (Compose, or `docker stack`); `images` pulls a stack's missing images
    before it starts, with progress (ImagePulls, one machine), or pulls none
    (PullsElsewhere: each machine's engine pulls its own).
    `rental_limit_reached` (RentalCgroups.memory_limit_reached) tells a
    container OOM-killed at the rental's shared limit from one killed at its
    own, for the failed deploy's errorMsg."""

    backend: StackBackend
    engine: DockerEngine
    reporter: StatusReporter
    sandbox: Sandbox
    db: AgentDB
    images: StackPulls
    rental_limit_reached: LimitReached


@dataclass(frozen=True, kw_only=True)
class DeploySettings:
    """Where stacks are kept and how long a deploy watches them, from the host's
    settings: `home_dir` is the HOME the backend resolves a file's `~` in."""

    stacks_dir: Path
    home_dir: Path
    settle_seconds: float
    stop_timeout: int
    stacks_per_rental: int


class StackDeployer:
    def __init__(self, *, parts: DeployParts, settings: DeploySettings):
        """Its collaborators, and the settings it holds deploys to: two parts,
        given by keyword, so the composition root says what each one is."""
        self.backend, self.engine, self.reporter = parts.backend, parts.engine, parts.reporter
        self.sandbox, self.db, self.images = parts.sandbox, parts.db, parts.images
        self.rental_limit_reached = parts.rental_limit_reached
        self.stacks_dir, self.home_dir = settings.stacks_dir, settings.home_dir
        self.settle_seconds, self.stop_timeout = settings.settle_seconds, settings.stop_timeout
        self.stacks_per_rental = settings.stacks_per_rental
        self._stack_secrets: dict[str, tuple[str, list[str]]] = {}  # what each stack added to the redactor, by rental
        self.stacks_dir.mkdir(parents=True, exist_ok=True, mode=0o700)

    # ---- reports -------------------------------------------------------------
    def _report(self, job: wire_jobs.StackJob, status: str, error_msg: str = "") -> None:
        self.reporter.status(StackRef.of_job(job), status, error_msg, job_id=job.job_id)

    async def push_containers(self, stack_id: str, raw: list[ContainerSummary] | None = None) -> list[wire.Container]:
        raw = await self.engine.stack_containers(stack_id) if raw is None else raw
        containers = seed_containers(raw)
        self.reporter.containers(stack_id, containers)
        return containers

    # ---- deploy --------------------------------------------------------------
    def _begin(self, job: wire_jobs.StackJob) -> tuple[wire_jobs.StackTemplate, dict[str, str], str, Path]:
        """(template, variables, project, stack folder); the variables' values stay out of the logs."""
        template = job.template or {}
        variables = dict(template.get("environmentVariables") or {})
        self._forget_secrets(job.stack_id)
        if len(variables) <= MAX_VARIABLES:  # more are refused (check_variables) before a value is used
            # Only what can be a secret, and masked in this rental's lines and those that name none.
            secrets = [value for name, value in variables.items() if might_be_secret(name, value)]
            self._stack_secrets[job.stack_id] = (job.rental_id, secrets)
            SECRETS.add_many(secrets, scope=job.rental_id)
        project, workdir = StackRef.of_job(job).project, self.stacks_dir / job.stack_id
        self._report(job, wire.APPLYING)
        log.info("stack_applying", stack_id=job.stack_id, rental_id=job.rental_id, job_id=job.job_id, project=project)
        return template, variables, project, workdir

    async def _renter_file(
        self, job: wire_jobs.StackJob, template: wire_jobs.StackTemplate, variables: dict[str, str], workdir: Path
    ) -> RawReview:
        """The renter's file as Compose may read it, checked (off the loop: 512 KiB of YAML takes seconds)."""
        if crowded := crowded_rental_problem(self.db.stacks(), job.rental_id, job.stack_id, self.stacks_per_rental):
            raise StackRejected(crowded)
        check_variables(variables)
        raw = await asyncio.to_thread(review_raw, template.get("content", ""), variables.get("COMPOSE_PROFILES", ""))
        await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True, mode=0o700)
        await asyncio.to_thread(_write_private, workdir / ORIGINAL_FILE, raw.text)
        return raw

    async def _failed(self, job: wire_jobs.StackJob, project: str, workdir: Path, exc: Exception) -> str:
        """Whatever was started goes, then ERROR with the reason; returns it."""
        message = _failure_said(exc)
        await self._teardown(project, workdir, job.stack_id)
        self._report(job, wire.ERROR, message)
        await self._push_quietly(job.stack_id)
        log.warning("stack_failed", stack_id=job.stack_id, job_id=job.job_id, error=message)
        return message

    async def deploy(self, job: wire_jobs.StackJob, stops: DeployCancels | None = None) -> str:
        """Run the job's stack; returns "" on success, else the errorMsg reported.
        `stops` ends the wait for GPUs, the image pull, or the deploy before its
        `up`, when a removal of the stack or its rental's end overtook the job
        (deploy_stops.py)."""
        stops = stops or DeployCancels()
        # A redelivered job's, or the last deploy's: kept only when that deploy was seen through (APPLIED);
        # containers of one that crashed between up and its checks were never judged running well.
        applied = (self.db.stacks().get(job.stack_id) or {}).get("status") == wire.APPLIED
        running_before = await self._running(job.stack_id) if applied else []
        template, variables, project, workdir = self._begin(job)
        changed = False  # has this deploy touched the engine's containers yet (Compose's `up`)?
        try:
            raw = await self._renter_file(job, template, variables, workdir)
            await self.images.make_room()  # kept images the floor needs room from go first (core/images/cache.py)
            start = await self.backend.prepare(project, workdir / ORIGINAL_FILE, variables, raw)
            try:
                site = StackSite(
                    project=project,
                    project_dir=str(await asyncio.to_thread(workdir.resolve)),
                    home_dir=str(self.home_dir),
                    agent_dir=str(self.stacks_dir.parent),
                    foreign_names=start.foreign_names,
                )
                hardened, gpus, notices = await stops.unless_stopped(  # it may wait for GPUs being released
                    job,
                    self.sandbox.apply(
                        job, start.model, raw, site, waiting=lambda reason: self._report(job, wire.APPLYING, reason)
                    ),
                )
                labelled = label_services(
                    hardened, job.stack_id, job.rental_id, job.env_id, gpus, ssh=template.get("isSSHEnabled") is True
                )
                rewritten = self.backend.stack_file(labelled)  # one machine: every image as the agent pulled it
                await stops.unless_stopped(job, self._pull(job, labelled))  # by the pull policies asked
                if problems := await image_problems(self.engine, rewritten, local=self.images.pulls_locally):
                    raise StackRejected(POLICY_PREFIX + problems_said(problems))
                text = json.dumps(rewritten, indent=1)
                await asyncio.to_thread(_write_private, workdir / AGENT_FILE, text)  # the record of what ran
                stops.check(job)  # past this point the deploy finishes: its removal takes down what it made
                crash_points.crash_point("deploy.before_compose_up")
                changed = True
                await start.run(job.stack_id, text, rewritten)
            finally:
                await start.discard()
            containers = await self.backend.until_running(job.stack_id)
            await self._check_running(job.stack_id, containers)
            crash_points.crash_point("deploy.before_applied_report")
            self._report(job, wire.APPLIED, notices_message(notices))  # sent at once: the outbox is woken
            await self.push_containers(job.stack_id, containers)
            log.info("stack_applied", stack_id=job.stack_id, job_id=job.job_id, changes=len(notices))
            await self._settle(job.stack_id)
            return ""
        except (Refusal, OutsideFailure) as exc:  # by family: a bug goes on to the dispatcher
            if running_before and not changed:
                return await self._failed_beside(job, exc, running_before)
            return await self._failed(job, project, workdir, exc)

    async def _running(self, stack_id: str) -> list[ContainerSummary]:
        try:
            return [c for c in await self.engine.stack_containers(stack_id) if c.get("State") == "running"]
        except EngineError:
            return []

    async def _failed_beside(self, job: wire_jobs.StackJob, exc: Exception, running: list[ContainerSummary]) -> str:
        """A deploy that failed before it changed anything, beside containers of
        the stack that were running when it began (the same job's, delivered
        again after a crash; or the deploy before it): they are left running,
        and the report says both."""
        message = (
            _failure_said(exc)
            + f"; the stack's {len(running)} running container(s) from before this deploy were left running"
        )
        self._report(job, wire.ERROR, message)
        await self._push_quietly(job.stack_id)
        log.warning("stack_failed", stack_id=job.stack_id, job_id=job.job_id, error=message, kept_running=len(running))
        return message

    async def _pull(self, job: wire_jobs.StackJob, stack: ComposeModel) -> None:
        """The stack's missing images, checked to fit (core/images/disk_fit.py), then
        pulled with progress in APPLYING's errorMsg (core/images/pulls.py)."""
        if not self.images.pulls_locally:  # each machine's engine pulls its own: nothing to ask this one
            return
        images, fresh = pullable_images(stack), pullable_images(stack, FRESH_POLICIES)
        try:
            missing = sorted({*await self.engine.missing_images(images), *fresh})
        except EngineError:  # a reference the engine cannot read: Compose says why
            return
        await self.images.check_room(job.rental_id, missing)
        failed = await self.images.fetch(missing, lambda text: self._report(job, wire.APPLYING, text), job.rental_id)
        if failed:  # Compose pulls nothing here (compose_backend.py, stack_file): it is said now
            said = "; ".join(without_registry_reply(message) for message in failed.values())
            raise StackFailed(pull_failure(service_images(stack), sorted(failed), said) or said)
        await self.images.used(sorted({*images, *fresh}))

    async def _check_running(self, stack_id: str, raw: list[ContainerSummary] | None = None) -> None:
        raw = await self.engine.stack_containers(stack_id) if raw is None else raw
        if not raw:
            raise StackFailed("deploy failed: Compose reported success but no container of the stack exists")
        if too_many := oversized_container(raw):
            raise StackFailed(too_many)
        for container in failed_containers(raw):
            raise StackFailed(
                await describe_container(self.engine, container, " right after it started", self.rental_limit_reached)
            )

    async def _settle(self, stack_id: str) -> None:
        """Watch the first seconds after start: a container that dies right away
        is a failed deploy, not a running stack."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settle_seconds
        while loop.time() < deadline:
            await asyncio.sleep(min(0.25, max(0.0, deadline - loop.time())))
            await self._check_running(stack_id)

    async def _teardown(self, project: str, workdir: Path, stack_id: str) -> None:
        try:
            await self.backend.take_down_failed(project, workdir, stack_id)
        except (ComposeError, EngineError) as exc:
            log.error("stack_teardown_failed", stack_id=stack_id, project=project, error=str(exc))
        await asyncio.to_thread(shutil.rmtree, workdir, ignore_errors=True)

    # ---- remove --------------------------------------------------------------
    async def remove(self, job: wire_jobs.StackJob) -> str:
        workdir = self.stacks_dir / job.stack_id
        if await self._known_here(job.stack_id):
            self._report(job, wire.REMOVING)  # else only REMOVED: the marketplace may have forgotten it
        log.info("stack_removing", stack_id=job.stack_id, rental_id=job.rental_id, job_id=job.job_id)
        crash_points.crash_point("remove.before_compose_down")
        try:
            await self.backend.take_down(
                lambda: self.engine.stack_containers(job.stack_id), workdir, {StackRef.of_job(job).project}
            )
        except (ComposeError, EngineError) as exc:
            message = f"remove failed: {exc}"
            self._report(job, wire.ERROR, message)
            log.error("stack_remove_failed", stack_id=job.stack_id, job_id=job.job_id, error=message)
            return message
        crash_points.crash_point("remove.before_removed_report")
        shutil.rmtree(workdir, ignore_errors=True)
        self._forget_secrets(job.stack_id)
        self._report(job, wire.REMOVED)
        log.info("stack_removed", stack_id=job.stack_id, job_id=job.job_id)
        return ""

    async def _known_here(self, stack_id: str) -> bool:
        try:
            if await self.engine.stack_containers(stack_id):
                return True
        except EngineError:
            return True  # cannot tell: say what we are doing
        return await asyncio.to_thread((self.stacks_dir / stack_id).exists) or stack_id in self.db.stacks()

    # ---- rental end ------------------------------------------------------------
    def rental_ending(self, rental_id: str) -> None:
        """The rental's end job arrived: its GPUs are being released (a deploy
        that needs them waits for it, and the heartbeat says so)."""
        self.sandbox.ledger.begin_release(rental_id)

    async def end_rental(self, job: wire_jobs.StackJob) -> str:
        """After a rental's stacks were removed: take down anything of it still
        there (a stack the marketplace had already forgotten), then free its GPUs.
        Tried a few times: GPUs stay assigned while containers may still use them."""
        error = ""
        for attempt in range(3):
            error = await self._end_rental_once(job)
            if not error:
                return ""
            await asyncio.sleep(2**attempt)
        return error

    async def _end_rental_once(self, job: wire_jobs.StackJob) -> str:
        workdir = self.stacks_dir / f".end-{job.rental_id}"
        try:
            stacks = await self._rental_stacks(job.rental_id)
            projects = await self.backend.take_down(
                lambda: self.engine.rental_containers(job.rental_id), workdir, set()
            )
        except (ComposeError, EngineError) as exc:
            message = f"rental cleanup failed: {exc}"
            log.error("rental_end_failed", rental_id=job.rental_id, job_id=job.job_id, error=message)
            return message  # GPUs stay assigned while its containers may still run
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        freed = await self.sandbox.release(job.rental_id)
        for stack_id, project in sorted(stacks.items()):  # the marketplace may not know they are gone
            shutil.rmtree(self.stacks_dir / stack_id, ignore_errors=True)
            self._forget_secrets(stack_id)
            gone = StackRef(stack_id, job.rental_id, job.env_id, project or naming.project_name("", stack_id))
            self.reporter.status(gone, wire.REMOVED, job_id=job.job_id)
        log.info(
            "rental_ended",
            rental_id=job.rental_id,
            job_id=job.job_id,
            leftover_stacks=len(projects),
            gpus_freed=len(freed),
        )
        return ""

    async def _rental_stacks(self, rental_id: str) -> dict[str, str]:
        """The rental's stacks still here, by Docker's labels and the record: stack id -> project."""
        stacks = {
            c["Labels"][wire.LABEL_STACK]: c["Labels"].get(COMPOSE_PROJECT_LABEL, "")
            for c in await self.engine.rental_containers(rental_id)
            if (c.get("Labels") or {}).get(wire.LABEL_STACK)
        }
        stacks.update(
            {
                stack_id: row["project"]
                for stack_id, row in self.db.stacks().items()
                if row["rental_id"] == rental_id and stack_id not in stacks
            }
        )
        return stacks

    async def _push_quietly(self, stack_id: str) -> None:
        try:
            await self.push_containers(stack_id)
        except EngineError as exc:
            log.warning("container_list_failed", stack_id=stack_id, error=str(exc))

    def _forget_secrets(self, stack_id: str) -> None:
        rental_id, secrets = self._stack_secrets.pop(stack_id, (None, []))
        SECRETS.discard_many(secrets, scope=rental_id)


def _failure_said(exc: Exception) -> str:
    """A failed deploy's errorMsg: the reason, an engine's named as one."""
    return str(exc) if not isinstance(exc, EngineError) else f"Docker Engine error: {exc}"


def _write_private(path: Path, text: str) -> None:
    """Owner-only: the agent's file holds the template's interpolated values."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
