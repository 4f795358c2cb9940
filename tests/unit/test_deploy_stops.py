"""A deploy that its stack's removal or its rental's end overtook stops early
(core/stacks/deploy_cancels.py): while it waits for a deploy slot or pulls its
images, never once its `up` runs, and never a deploy that arrived after the
removal. The real dispatcher, around a deployer whose pull is held until
released."""

from __future__ import annotations

import asyncio

from support.fakes import FakeOutbox
from support.stacks import job_payload
from support.waiting import until
from support.wiring import dispatcher_for

from gpuhost_agent.core.stacks.deploy_cancels import DeployCancelled, DeployCancels
from gpuhost_agent.core.stacks.dispatcher import JobDispatcher
from gpuhost_agent.protocol import wire, wire_jobs

REMOVAL_CAME = "deploy stopped: the stack's removal came before the deploy finished"


class PullingDeployer:
    """A deploy pulls (held until `pulled` is set), then runs its `up` (held
    until `up_done` is set); what each job reached is recorded."""

    def __init__(self) -> None:
        self.pulled, self.up_done = asyncio.Event(), asyncio.Event()
        self.pulling: list[str] = []
        self.pull_cancelled: list[str] = []
        self.up: list[str] = []
        self.removed: list[str] = []

    async def _pull(self, job: wire_jobs.StackJob) -> None:
        self.pulling.append(job.job_id)
        try:
            await self.pulled.wait()
        except asyncio.CancelledError:
            self.pull_cancelled.append(job.job_id)
            raise

    async def deploy(self, job: wire_jobs.StackJob, stops: DeployCancels | None = None) -> str:
        assert stops is not None
        try:
            await stops.unless_stopped(job, self._pull(job))
            stops.check(job)
        except DeployCancelled as exc:  # the real deployer reports ERROR and takes down what it made
            return str(exc)
        self.up.append(job.job_id)
        await self.up_done.wait()
        return ""

    async def remove(self, job: wire_jobs.StackJob) -> str:
        self.removed.append(job.job_id)
        return ""

    async def end_rental(self, job: wire_jobs.StackJob) -> str:
        self.removed.append(job.job_id)
        return ""

    def rental_ending(self, rental_id: str) -> None:
        pass


def _outcomes(outbox: FakeOutbox) -> dict[str, tuple[str, str | None]]:
    return {
        target: (body["outcome"], body.get("errorMsg")) for _kind, target, body in outbox.reports if "outcome" in body
    }


async def _two_pulling(*deploys: tuple[str, str, str]) -> tuple[PullingDeployer, FakeOutbox, JobDispatcher]:
    """A real dispatcher whose deploys (job, stack, rental) both pull, held."""
    deployer, outbox = PullingDeployer(), FakeOutbox()
    dispatcher = dispatcher_for(deployer, outbox)
    for job_id, stack_id, rental_id in deploys:
        dispatcher.submit(job_payload(job_id, stack_id, rental_id=rental_id))
    await until(lambda: len(deployer.pulling) == len(deploys))
    return deployer, outbox, dispatcher


async def test_a_removal_stops_the_pull_of_the_deploy_it_overtook_and_runs_at_once() -> None:
    deployer, outbox, dispatcher = await _two_pulling(
        ("deploy-1", "stack-a", "rental-1"), ("deploy-other", "stack-b", "rental-1")
    )
    dispatcher.submit(job_payload("remove-1", "stack-a", wire.JOB_REMOVE, rental_id="rental-1"))
    await until(lambda: "remove-1" in _outcomes(outbox))
    assert deployer.pull_cancelled == ["deploy-1"] and deployer.removed == ["remove-1"]
    assert _outcomes(outbox)["deploy-1"] == (wire.OUTCOME_FAILED, REMOVAL_CAME)
    # Another stack's deploy of the same rental pulls on; a deploy sent after the removal runs.
    dispatcher.submit(job_payload("deploy-2", "stack-a", rental_id="rental-1"))
    deployer.pulled.set()
    deployer.up_done.set()
    await until(lambda: not dispatcher._running)
    assert sorted(deployer.up) == ["deploy-2", "deploy-other"]
    assert _outcomes(outbox)["deploy-2"] == (wire.OUTCOME_SUCCEEDED, None)


async def test_a_deploy_waiting_for_a_slot_is_stopped_without_starting() -> None:
    deployer, outbox = PullingDeployer(), FakeOutbox()
    dispatcher = dispatcher_for(deployer, outbox, deploy_concurrency=1)
    dispatcher.submit(job_payload("deploy-busy", "stack-busy", rental_id="rental-1"))
    dispatcher.submit(job_payload("deploy-waiting", "stack-a", rental_id="rental-2"))
    await until(lambda: dispatcher.stats()["deploysWaiting"] == 1)
    dispatcher.submit(job_payload("remove-a", "stack-a", wire.JOB_REMOVE, rental_id="rental-2"))
    await until(lambda: "remove-a" in _outcomes(outbox))
    assert _outcomes(outbox)["deploy-waiting"] == (wire.OUTCOME_FAILED, REMOVAL_CAME)
    assert deployer.pulling == ["deploy-busy"] and dispatcher.stats()["deploysWaiting"] == 0
    deployer.pulled.set()
    deployer.up_done.set()
    await until(lambda: not dispatcher._running)
    assert _outcomes(outbox)["deploy-busy"] == (wire.OUTCOME_SUCCEEDED, None)
    dispatcher.submit(job_payload("deploy-next", "stack-c", rental_id="rental-3"))  # the slot was given back
    await until(lambda: "deploy-next" in _outcomes(outbox))


async def test_a_rental_end_stops_its_rentals_pulls_alone() -> None:
    deployer, outbox, dispatcher = await _two_pulling(
        ("deploy-ending", "stack-a", "rental-ending"), ("deploy-staying", "stack-b", "rental-staying")
    )
    end = {
        **job_payload("end-1", "", wire.JOB_RENTAL_END, rental_id="rental-ending"),
        "stackName": "",
        "template": None,
    }
    dispatcher.submit(end)
    await until(lambda: "end-1" in _outcomes(outbox))
    assert deployer.pull_cancelled == ["deploy-ending"]
    assert _outcomes(outbox)["deploy-ending"] == (
        wire.OUTCOME_FAILED,
        "deploy stopped: the rental ended before the deploy finished",
    )
    assert "deploy-staying" not in _outcomes(outbox)
    deployer.pulled.set()
    deployer.up_done.set()
    await until(lambda: "deploy-staying" in _outcomes(outbox))


async def test_a_deploy_whose_up_runs_finishes_and_its_removal_waits_for_it() -> None:
    deployer, outbox = PullingDeployer(), FakeOutbox()
    dispatcher = dispatcher_for(deployer, outbox)
    deployer.pulled.set()
    dispatcher.submit(job_payload("deploy-1", "stack-a"))
    await until(lambda: deployer.up == ["deploy-1"])
    dispatcher.submit(job_payload("remove-1", "stack-a", wire.JOB_REMOVE))
    await asyncio.sleep(0.05)
    assert deployer.removed == [] and not deployer.pull_cancelled
    deployer.up_done.set()
    await until(lambda: deployer.removed == ["remove-1"])
    assert _outcomes(outbox)["deploy-1"] == (wire.OUTCOME_SUCCEEDED, None)
