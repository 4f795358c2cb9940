"""A HostReporter just after its session with the local marketplace, and
what it put in its outbox: for the tests that check the machine reports
against docs/agent-api.yaml (test_api_docs_machine.py, test_api_docs_reports.py)."""

from __future__ import annotations

import json
import time

from gpuhost_agent.core.gpus.ledger import GpuLedger
from gpuhost_agent.core.host_reporter import HostReporter, HostReporterParts, HostReportSettings
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.protocol import intervals as wire_intervals
from gpuhost_agent.protocol import wire_time
from support.fakes import FakeClient, FakeOutbox, FakeProber, FakeSchedule
from support.settings import defaults


def session_reporter(
    state: MarketplaceState, data: dict, ledger: GpuLedger | None = None
) -> tuple[HostReporter, FakeOutbox, FakeClient]:
    """A HostReporter after its session: requirements, intervals and clock from the local marketplace."""
    outbox, client = FakeOutbox(), FakeClient(state)
    parts = HostReporterParts(
        client=client,
        outbox=outbox,
        prober=FakeProber(data),
        schedule=FakeSchedule(),  # type: ignore[arg-type]
        find_compose=lambda: ["docker", "compose"],
        compose_found=lambda _command: None,
        ledger=ledger,
    )
    settings = HostReportSettings(**defaults("speed_max_bytes", "speed_max_seconds"))
    reporter = HostReporter(parts=parts, settings=settings)
    reply = {
        "sessionId": "s",
        "envId": state.store.envId,
        "serverTime": wire_time.iso(),
        "requeuedJobs": 0,
        "intervals": state.intervals,
        "requirements": state.requirements,
    }
    now = time.time()
    wired = json.loads(json.dumps(reply))
    reporter.session_opened(wired, wire_intervals.from_reply(wired["intervals"]), now, now)
    return reporter, outbox, client


def outbox_bodies(outbox: FakeOutbox, kind: str) -> list[dict]:
    return [body for k, _target, body in outbox.reports if k == kind]
