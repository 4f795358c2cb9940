"""The local marketplace's store: reports in order, removals kept, jobs redelivered, state kept over a restart."""

from __future__ import annotations

from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.protocol import wire, wire_time


def _store_with_stack():
    store = Store.load_or_create(None)
    rental = store.create_rental(name=None, gpu_count=0, end_date=None)
    stack = store.create_stack(
        rental["rentalId"], {"name": "n", "description": "", "content": "", "environmentVariables": {}}
    )
    return store, rental, stack


def test_status_reports_are_idempotent_and_stale_ones_ignored():
    store, _rental, stack = _store_with_stack()
    sid = stack["stackId"]
    applied = {"status": wire.APPLIED, "reportedAt": "2026-01-01T00:00:02.000000Z", "pStackName": "p", "pStackId": 7}
    assert store.apply_status(sid, applied) and store.apply_status(sid, applied)
    assert not store.apply_status(sid, {"status": wire.APPLYING, "reportedAt": "2026-01-01T00:00:01.000000Z"})
    assert store.stacks[sid]["status"] == wire.APPLIED and store.stacks[sid]["pStackId"] == 7


def test_reports_cannot_undo_a_requested_removal():
    store, rental, stack = _store_with_stack()
    sid = stack["stackId"]
    store.remove_stack(rental["rentalId"], sid)
    assert not store.apply_status(sid, {"status": wire.APPLIED, "reportedAt": wire_time.iso()})
    assert store.stacks[sid]["status"] == wire.REMOVING
    assert store.apply_status(sid, {"status": wire.REMOVED, "reportedAt": wire_time.iso()})
    assert sid not in store.stacks
    assert store.apply_status(sid, {"status": wire.REMOVED, "reportedAt": wire_time.iso()}) is False


def test_jobs_are_redelivered_to_a_new_session_until_completed():
    store, _rental, stack = _store_with_stack()
    (job,) = store.deliverable(10)
    assert store.deliverable(10) == []
    assert store.requeue_unfinished() == 1
    assert [j.jobId for j in store.deliverable(10)] == [job.jobId]
    store.complete_job(job.jobId, wire.OUTCOME_SUCCEEDED, None)
    store.complete_job(job.jobId, wire.OUTCOME_FAILED, "late duplicate")  # harmless
    assert job.outcome == wire.OUTCOME_SUCCEEDED
    assert store.requeue_unfinished() == 0


def test_store_survives_restart(tmp_path):
    path = tmp_path / "m.json"
    store = Store.load_or_create(path)
    rental = store.create_rental(name="r", gpu_count=1, end_date=None)
    store.create_stack(rental["rentalId"], {"name": "n", "description": "", "content": "", "environmentVariables": {}})
    store.save()
    again = Store.load_or_create(path)
    assert (again.envId, again.envApiKey, again.renterApiKey) == (store.envId, store.envApiKey, store.renterApiKey)
    assert list(again.stacks) == list(store.stacks) and list(again.jobs) == list(store.jobs)
    assert (path.stat().st_mode & 0o777) == 0o600
