"""Pure decision logic, tested without Docker or HTTP."""

from __future__ import annotations

import io
import json

import pytest

from gpuhost_agent.common import logs
from gpuhost_agent.core import naming
from gpuhost_agent.core.compose_rewrite import StackRejected, check_variables, label_services
from gpuhost_agent.core.containers import failed_containers, seed_containers, to_seed_container
from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.compose import clean_error


def test_project_name_is_compose_safe_unique_and_stable():
    a = naming.project_name("My GPU Stack!", "3F2B9C1D-aaaa")
    assert a == "my-gpu-stack-3f2b9c1d"
    assert naming.project_name("My GPU Stack!", "3F2B9C1D-aaaa") == a
    assert naming.project_name("web", "11111111-x") != naming.project_name("web", "22222222-x")
    assert naming.project_name("!!!", "abc") == "stack-abc"
    assert (
        naming.project_name("x" * 200, "abcdef12").endswith("-abcdef12")
        and len(naming.project_name("x" * 200, "a")) < 64
    )


def test_a_project_found_on_docker_gives_back_the_name_that_finds_it():
    """The reconciler removes a stack the marketplace no longer names by the
    name its project holds; an id with a '-' early must not cut the name short."""
    for name, stack_id in [("web", "stk-1"), ("my-web-ui", "a-b-c-d-e"), ("", "3f2b9c1d-aaaa"), ("x", "abc")]:
        project = naming.project_name(name, stack_id)
        assert naming.project_name(naming.stack_name_of(project, stack_id), stack_id) == project
    assert naming.stack_name_of("web-stk-1", "stk-1") == "web"


def test_provider_stack_id_is_stable_positive_int():
    first = naming.provider_stack_id("stack-1")
    assert first == naming.provider_stack_id("stack-1") and 0 < first < 2**31
    assert first != naming.provider_stack_id("stack-2")


def test_seed_container_shape():
    raw = {
        "Id": "abc",
        "Names": ["/p-web-1"],
        "Created": 1700000000,
        "State": "running",
        "Status": "Up 1s",
        "Labels": {"b": "2", "a": "1"},
        "Ports": [
            {"PrivatePort": 80, "Type": "tcp"},
            {"IP": "0.0.0.0", "PrivatePort": 8080, "PublicPort": 32768, "Type": "tcp"},
        ],
    }
    shaped = to_seed_container(raw)
    assert shaped == {
        "Name": "p-web-1",
        "Id": "abc",
        "Created": 1700000000,
        "Labels": ["a=1", "b=2"],
        "Ports": [
            {"PrivatePort": 80, "Type": "tcp"},
            {"PrivatePort": 8080, "Type": "tcp", "IP": "0.0.0.0", "PublicPort": 32768},
        ],
        "State": "running",
    }
    assert [c["Name"] for c in seed_containers([{**raw, "Names": ["/z"]}, {**raw, "Names": ["/a"]}])] == ["a", "z"]
    assert failed_containers([{"State": "running"}, {"State": "exited"}, {"State": "dead"}]) == [
        {"State": "exited"},
        {"State": "dead"},
    ]


@pytest.mark.parametrize("name", ["COMPOSE_PROJECT_NAME", "COMPOSE_FILE", "DOCKER_HOST", "PATH", "HOME", "BUILDKIT_X"])
def test_variables_that_steer_compose_are_refused(name):
    with pytest.raises(StackRejected, match=name):
        check_variables({name: "x"})


@pytest.mark.parametrize("name", ["1ABC", "A-B", "", "A B"])
def test_invalid_variable_names_are_refused(name):
    with pytest.raises(StackRejected, match="invalid"):
        check_variables({name: "x"})


def test_label_services_adds_agent_labels_and_drops_project_name():
    model = {
        "name": "theirs",
        "services": {
            "a": {"image": "x", "labels": {"keep": "1", wire.LABEL_STACK: "forged"}},
            "b": {"image": "y", "labels": ["k=v", "flag"]},
        },
    }
    out = label_services(model, "s1", "r1", "e1")
    assert "name" not in out and model["name"] == "theirs", "input must not be mutated"
    assert out["services"]["a"]["labels"] == {
        "keep": "1",
        wire.LABEL_MANAGED: "true",
        wire.LABEL_STACK: "s1",
        wire.LABEL_RENTAL: "r1",
        wire.LABEL_ENV: "e1",
        wire.LABEL_GPUS: "",  # every label of the agent's namespace is said, "no" too (issue 31, finding 10)
        wire.LABEL_SSH: "",
    }
    assert out["services"]["b"]["labels"]["k"] == "v" and out["services"]["b"]["labels"]["flag"] == ""
    with pytest.raises(StackRejected, match="no services"):
        label_services({"services": {}}, "s", "r", "e")


def test_validate_template_fills_defaults_and_rejects_wrong_types():
    t = wire.validate_template({"name": "n", "description": "", "content": "c", "environmentVariables": {"A": "1"}})
    assert t["insecure"] is False and t["isSSHEnabled"] is False and t["isBasicAuthEnabled"] is False
    with pytest.raises(wire.InvalidBody, match="name must not be empty"):
        wire.validate_template({**t, "name": "  "})
    with pytest.raises(wire.InvalidBody, match="larger than"):
        wire.validate_template({**t, "content": "x" * (wire.MAX_CONTENT_BYTES + 1)})


@pytest.mark.parametrize(
    "bad", [{"stackId": "../../etc"}, {"jobId": "a/b"}, {"type": "stack.explode"}, {"template": None}, {"rentalId": ""}]
)
def test_stack_job_refuses_malformed_jobs(bad):
    good = {
        "jobId": "j1",
        "type": wire.JOB_DEPLOY,
        "stackId": "s1",
        "rentalId": "r1",
        "envId": "e1",
        "template": {"name": "n", "description": "", "content": "c", "environmentVariables": {}},
    }
    assert wire.StackJob.from_wire(good).stack_id == "s1"
    with pytest.raises(wire.InvalidBody):
        wire.StackJob.from_wire({**good, **bad})


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
    assert not store.apply_status(sid, {"status": wire.APPLIED, "reportedAt": wire.iso()})
    assert store.stacks[sid]["status"] == wire.REMOVING
    assert store.apply_status(sid, {"status": wire.REMOVED, "reportedAt": wire.iso()})
    assert sid not in store.stacks
    assert store.apply_status(sid, {"status": wire.REMOVED, "reportedAt": wire.iso()}) is False


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


def test_secrets_never_reach_a_log_line():
    stream = io.StringIO()
    logs.configure("info", json_lines=True, stream=stream)
    logs.SECRETS.add("hunter2-secret-value")
    log = logs.get_logger("t")
    log.info(
        "deploy",
        error="compose said: invalid value hunter2-secret-value here",
        api_key="k-123456",
        environmentVariables={"A": "x"},
        nested={"token": "abc12345", "fine": "ok"},
    )
    line = json.loads(stream.getvalue())
    assert "hunter2-secret-value" not in stream.getvalue()
    assert line["error"] == "compose said: invalid value *** here"
    assert line["api_key"] == logs.MASK and line["environmentVariables"] == logs.MASK
    assert line["nested"] == {"token": logs.MASK, "fine": "ok"}
    logs.configure("warning", json_lines=True)


def test_compose_errors_lose_agent_paths(tmp_path):
    text = f"Container x  Creating\nfailed to parse {tmp_path}/compose.yaml: yaml: line 1: bad\n"
    assert clean_error(text, tmp_path) == "failed to parse compose.yaml: yaml: line 1: bad"


def test_secret_registry_counts_shared_values():
    registry = logs.SecretRegistry()
    registry.add_many(["shared-value", "only-a"])
    registry.add_many(["shared-value", "abc"])  # "abc" is too short to scrub
    assert "abc" not in registry and registry.scrub("x shared-value only-a") == "x *** ***"
    registry.discard_many(["shared-value", "only-a"])
    assert registry.scrub("shared-value only-a") == "*** only-a"
    registry.discard_many(["shared-value"])
    assert "shared-value" not in registry
