"""At most GPUHOST_DEPLOY_CONCURRENCY deploys run at once:
twenty stacks created in the same second must not start forty Compose
processes together. The ones waiting say so (APPLYING with a reason), and a
removal is never held behind them: it frees what they may wait for."""

from __future__ import annotations

import asyncio

from support.fakes import FakeOutbox
from support.stacks import job_payload
from support.waiting import until
from support.wiring import dispatcher_for

from gpuhost_agent.protocol import wire, wire_jobs
from gpuhost_agent.service.status.render import render


class HeldDeployer:
    """Deploys that run until released, counting how many run together."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.running = 0
        self.most = 0
        self.removed: list[str] = []

    async def deploy(self, job: wire_jobs.StackJob, stops: object = None) -> str:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await self.release.wait()
        finally:
            self.running -= 1
        return ""

    async def remove(self, job: wire_jobs.StackJob) -> str:
        self.removed.append(job.stack_id)
        return ""


def _status(dispatcher) -> dict:
    """The status socket's answer, as far as the jobs line needs it."""
    return {"version": "test", "pid": 1, "jobs": dispatcher.stats()}


def _waiting_reports(outbox: FakeOutbox) -> set[str]:
    return {
        target
        for kind, target, body in outbox.reports
        if body.get("status") == wire.APPLYING and "waiting for its turn" in (body.get("errorMsg") or "")
    }


async def test_no_more_deploys_run_at_once_than_the_setting_and_the_others_say_they_wait() -> None:
    deployer, outbox = HeldDeployer(), FakeOutbox()
    dispatcher = dispatcher_for(deployer, outbox, deploy_concurrency=2)
    for i in range(6):
        dispatcher.submit(job_payload(f"job-{i}", f"stack-{i}", rental_id=f"rental-{i}"))
    await until(lambda: deployer.running == 2)
    await asyncio.sleep(0.05)
    assert deployer.running == 2
    assert _waiting_reports(outbox) == {f"stack-{i}" for i in range(2, 6)}
    assert dispatcher.stats()["deploysWaiting"] == 4 and dispatcher.stats()["deployConcurrency"] == 2
    line = next(line for line in render(_status(dispatcher)).splitlines() if "jobs:" in line)
    assert "6 running (4 deploys waiting: at most 2 at once)" in line
    message = next(body["errorMsg"] for _k, _t, body in outbox.reports if "waiting" in (body.get("errorMsg") or ""))
    assert "GPUHOST_DEPLOY_CONCURRENCY" in message and "2 deploys" in message

    dispatcher.submit(job_payload("job-remove", "stack-other", wire.JOB_REMOVE))  # not held behind the deploys
    await until(lambda: deployer.removed == ["stack-other"])

    deployer.release.set()
    await until(lambda: not dispatcher._running)
    assert deployer.most == 2 and dispatcher.stats()["deploysWaiting"] == 0
    finished = {target for kind, target, body in outbox.reports if body.get("outcome") == wire.OUTCOME_SUCCEEDED}
    assert finished == {f"job-{i}" for i in range(6)} | {"job-remove"}


async def test_deploys_within_the_setting_start_without_waiting() -> None:
    deployer, outbox = HeldDeployer(), FakeOutbox()
    dispatcher = dispatcher_for(deployer, outbox, deploy_concurrency=4)
    for i in range(4):
        dispatcher.submit(job_payload(f"job-{i}", f"stack-{i}", rental_id=f"rental-{i}"))
    await until(lambda: deployer.running == 4)
    assert not _waiting_reports(outbox)
    deployer.release.set()
    await until(lambda: not dispatcher._running)


async def test_one_rental_never_holds_every_turn() -> None:
    """A deploy may hold its turn for minutes (`up` waits for a healthcheck its
    dependents need), and a renter can hold one on purpose: five stacks of one
    rental whose services never become healthy held every turn, and another
    renter's deploy waited for the bound on `up`. One turn
    is left for the other rentals; the rental's next deploy waits for its own."""
    deployer, outbox = HeldDeployer(), FakeOutbox()
    dispatcher = dispatcher_for(deployer, outbox, deploy_concurrency=3)
    for i in range(5):
        dispatcher.submit(job_payload(f"job-{i}", f"stack-{i}", rental_id="rental-held"))
    await until(lambda: deployer.running == 2)
    await asyncio.sleep(0.05)
    assert deployer.running == 2 and dispatcher.stats()["deploysWaiting"] == 3
    assert _waiting_reports(outbox) == {"stack-2", "stack-3", "stack-4"}
    message = next(body["errorMsg"] for _k, t, body in outbox.reports if t == "stack-2" and body.get("errorMsg"))
    assert "its rental runs 2 deploys at once at most on this host" in message, message

    dispatcher.submit(job_payload("job-other", "stack-other", rental_id="rental-other"))
    await until(lambda: deployer.running == 3)
    assert "stack-other" not in _waiting_reports(outbox)

    deployer.release.set()
    await until(lambda: not dispatcher._running)
    assert deployer.most == 3 and dispatcher.stats()["deploysWaiting"] == 0 and not dispatcher._turns._rentals
