"""Property-based tests of everything that decodes what the other side sent:
the agent's job decoder and the local marketplace's report validators.

Whatever arrives, a decoder answers "this is fine" (with values of the types the
code after it relies on) or "this is wrong, because ..." in a short message; it
never raises anything else, since one stray exception in the agent's poll loop
or in a marketplace handler would stop all the other jobs or reports with it.
"""

from __future__ import annotations

import asyncio
import copy
import os
import re
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir
from support.fakes import FakeDeployer, Recorder
from support.machine_samples import heartbeat
from support.wiring import dispatcher_for

from gpuhost_agent.local_marketplace.agent_api import _containers_problem, _status_problem
from gpuhost_agent.local_marketplace.host_api import heartbeat_problem, init_state_problem, system_data_problem
from gpuhost_agent.local_marketplace.shapes import HARDWARE_FIELDS
from gpuhost_agent.protocol import wire, wire_jobs, wire_time, wire_values
from gpuhost_agent.storage.agent_db import AgentDB
from gpuhost_agent.uplink.outbox import JOB_COMPLETE, STATUS, Outbox

# Hypothesis's default 100 examples per property (50 for the dispatcher's, which
# runs jobs) keep the file near ten seconds, CI's fixed slice within the fast
# suite's minute; `make fuzz` runs twenty times as many (GPUHOST_PROPERTY_SCALE).
# No example database, and Hypothesis's caches go to the temporary directory: the
# repository stays clean, and a run does not depend on earlier ones.
if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
    set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "gpuhost-agent-hypothesis")
SCALE = float(os.environ.get("GPUHOST_PROPERTY_SCALE") or 1)
FAST = settings(
    max_examples=int(100 * SCALE),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
SLOWER = settings(FAST, max_examples=int(50 * SCALE))

# The ids the agent turns into directory names and labels (docs/agent-api.yaml HostSafeId).
SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
MAX_MESSAGE = 300  # a refusal is read by operators and renters: short, never the input itself

JOB_KEYS = (
    "jobId",
    "type",
    "stackId",
    "rentalId",
    "envId",
    "stackName",
    "template",
    "rental",
    "deliveries",
    "createdAt",
)
TEMPLATE_KEYS = (
    "name",
    "description",
    "content",
    "environmentVariables",
    "insecure",
    "isBasicAuthEnabled",
    "isSSHEnabled",
)
REPORT_KEYS = (
    "status",
    "reportedAt",
    "errorMsg",
    "pStackName",
    "pStackId",
    "jobId",
    "assignedGPUs",
    "containers",
    "observedAt",
    "Name",
    "Id",
    "State",
    "Created",
    "Labels",
    "Ports",
    "systemData",
    "fingerprint",
    "listing",
    "compliance",
    "checks",
    "isCompliant",
    "failedComplianceReason",
    "totalGPUs",
    "state",
    "phases",
    "updatedAt",
    "error",
    "sentAt",
    "host",
    "gpus",
    "uuid",
)

# ---- strategies -------------------------------------------------------------------------

ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True)
# Near misses of an id: separators, a leading dot, a trailing newline, too long, not text.
bad_ids = st.one_of(
    st.sampled_from(["", "../x", "a/b", ".hidden", "-x", "_x", "j1\n", "a b", "x" * 129, "é", "j\x00"]),
    st.integers(),
    st.none(),
    st.booleans(),
    st.lists(ids, max_size=2),
)
dates = st.sampled_from(
    [
        "2026-01-01T00:00:00.000000Z",
        "2026-05-04T10:11:12+02:00",
        "2026-05-04",
        "yesterday",
        "",
        "9999-12-31T23:59:59Z",
        "9999-12-31T23:00:00-05:00",
        "0001-01-01T00:00:00-23:59",
        "0001-01-01T00:00:00+05:00",
    ]
)
texts = st.one_of(st.text(max_size=30), st.sampled_from(["\ud800", "a\x00b", "stack.deploy", "APPLIED", "x" * 300]))
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-2, max_value=2048), st.floats(), texts, dates, ids
)
keys = st.one_of(st.sampled_from(JOB_KEYS + TEMPLATE_KEYS + REPORT_KEYS + ("gpuCount",)), st.text(max_size=8))
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=6)),
    max_leaves=25,
)


@st.composite
def templates(draw) -> dict:
    variables = draw(
        st.dictionaries(
            st.from_regex(r"[A-Z_][A-Z0-9_]{0,8}", fullmatch=True),
            st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12),
            max_size=3,
        )
    )
    template = {
        "name": draw(st.from_regex(r"[A-Za-z][A-Za-z0-9 ]{0,15}", fullmatch=True)),
        "description": draw(st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)),
        "content": "services:\n  web:\n    image: x\n",
        "environmentVariables": variables,
    }
    for flag in ("insecure", "isBasicAuthEnabled", "isSSHEnabled"):
        if draw(st.booleans()):
            template[flag] = draw(st.booleans())
    return template


@st.composite
def valid_jobs(draw, types: tuple[str, ...] = wire.JOB_TYPES) -> dict:
    job_type = draw(st.sampled_from(types))
    rental_id = draw(ids)
    job = {
        "jobId": draw(ids),
        "type": job_type,
        "stackId": "" if job_type == wire.JOB_RENTAL_END else draw(ids),
        "rentalId": rental_id,
        "envId": draw(ids),
        "stackName": ""
        if job_type == wire.JOB_RENTAL_END
        else draw(st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)),
        "template": draw(templates()) if job_type == wire.JOB_DEPLOY else None,
        "rental": {
            "rentalId": rental_id,
            "gpuCount": draw(st.integers(0, wire_jobs.MAX_GPU_COUNT)),
            "endDate": None,
            "status": wire.RENTAL_ACTIVE,
        },
        "deliveries": 1,
        "createdAt": wire_time.iso(),
    }
    return job


@st.composite
def mutated_jobs(draw) -> dict:
    """A valid job with one to three fields (of the job, its template, its
    variables or its rental) replaced by anything, or removed."""
    job = copy.deepcopy(draw(valid_jobs()))
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(("job", "job", "template", "variables", "rental")))
        target = {
            "job": job,
            "template": job.get("template"),
            "rental": job.get("rental"),
            "variables": (job.get("template") or {}).get("environmentVariables")
            if isinstance(job.get("template"), dict)
            else None,
        }[where]
        if not isinstance(target, dict):
            continue
        key = draw(st.one_of(st.sampled_from(sorted(target) or ["x"]), keys))
        if draw(st.integers(0, 4)) == 0:
            target.pop(key, None)
        else:
            target[key] = draw(st.one_of(json_values, bad_ids, st.integers(), st.floats()))
    return job


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def _check_refusal(exc: wire_jobs.InvalidBody) -> None:
    message = str(exc)
    assert message and len(message) <= MAX_MESSAGE, message
    assert _encodable(message), "a refusal goes into JSON reports and logs"


def _decode(raw):
    """from_wire, with the one rule every input must keep: InvalidBody or a job."""
    try:
        return wire_jobs.StackJob.from_wire(raw)
    except wire_jobs.InvalidBody as exc:
        _check_refusal(exc)
        return None


def _assert_usable(job: wire_jobs.StackJob) -> None:
    """What the dispatcher, deployer and sandbox rely on in an accepted job."""
    assert job.type in wire.JOB_TYPES
    for value in (job.job_id, job.rental_id, job.env_id):
        assert isinstance(value, str) and SAFE_ID.fullmatch(value)
    if job.type == wire.JOB_RENTAL_END:
        assert job.stack_id == ""
    else:
        assert isinstance(job.stack_id, str) and SAFE_ID.fullmatch(job.stack_id)
    assert isinstance(job.stack_name, str) and _encodable(job.stack_name)
    assert type(job.gpu_count) is int and 0 <= job.gpu_count <= wire_jobs.MAX_GPU_COUNT
    if job.type == wire.JOB_DEPLOY:
        _assert_usable_template(job.template)
    else:
        assert job.template is None


def _assert_usable_template(template) -> None:
    assert isinstance(template, dict)
    for key in ("name", "description", "content"):
        assert isinstance(template[key], str) and _encodable(template[key])
    assert template["name"].strip()
    for flag in ("insecure", "isBasicAuthEnabled", "isSSHEnabled"):
        assert type(template[flag]) is bool
    for name, value in template["environmentVariables"].items():
        assert isinstance(name, str) and isinstance(value, str)
        assert _encodable(name) and _encodable(value) and "\x00" not in name + value


# ---- the agent's job decoder --------------------------------------------------------------


@FAST
@given(json_values)
def test_job_decoder_takes_anything(raw):
    job = _decode(raw)
    if job is not None:
        _assert_usable(job)


@FAST
@given(mutated_jobs())
def test_job_decoder_on_damaged_jobs(raw):
    job = _decode(raw)
    if job is None:
        return
    _assert_usable(job)
    assert job.job_id == raw["jobId"] and job.type == raw["type"]
    count = (raw.get("rental") or {}).get("gpuCount", 0)
    if raw["type"] == wire.JOB_DEPLOY or wire_values.is_whole(count, wire_jobs.MAX_GPU_COUNT):
        assert job.gpu_count == count
    else:
        assert job.gpu_count == 0  # a removal or rental end with a bad count goes through, handing nothing out


@FAST
@given(valid_jobs())
def test_job_decoder_accepts_every_valid_job(raw):
    job = wire_jobs.StackJob.from_wire(raw)
    _assert_usable(job)
    assert (job.job_id, job.type, job.stack_id, job.rental_id, job.env_id, job.stack_name, job.gpu_count) == (
        raw["jobId"],
        raw["type"],
        raw["stackId"],
        raw["rentalId"],
        raw["envId"],
        raw["stackName"],
        raw["rental"]["gpuCount"],
    )
    if job.type == wire.JOB_DEPLOY:
        assert job.template == wire_jobs.validate_template(raw["template"])


@FAST
@given(
    valid_jobs(),
    st.one_of(
        st.text(max_size=5),
        st.floats(),
        st.booleans(),
        st.none(),
        st.lists(st.integers()),
        st.integers(max_value=-1),
        st.integers(min_value=wire_jobs.MAX_GPU_COUNT + 1),
    ),
)
def test_a_gpu_count_that_is_not_a_sane_whole_number_is_refused(raw, count):
    """...for a deploy, which hands GPUs out; a removal or a rental's end goes
    through whatever the count (a bad rental's stacks must still go)."""
    raw["rental"]["gpuCount"] = count
    if raw["type"] != wire.JOB_DEPLOY:
        assert wire_jobs.StackJob.from_wire(raw).gpu_count == 0
        return
    try:
        wire_jobs.StackJob.from_wire(raw)
    except wire_jobs.InvalidBody as exc:
        assert "rental.gpuCount" in str(exc)
    else:
        raise AssertionError(f"gpuCount {count!r} was taken")


@FAST
@given(valid_jobs(), bad_ids, st.sampled_from(("jobId", "rentalId", "envId", "stackId")))
def test_an_unsafe_id_is_refused(raw, bad, key):
    if key == "stackId" and raw["type"] == wire.JOB_RENTAL_END:
        return  # rental.end names no stack; its stackId is not read
    raw[key] = bad
    try:
        wire_jobs.StackJob.from_wire(raw)
    except wire_jobs.InvalidBody as exc:
        assert key in str(exc)
    else:
        raise AssertionError(f"{key} {bad!r} was taken")


@FAST
@given(
    valid_jobs((wire.JOB_DEPLOY,)),
    st.one_of(st.text(max_size=10), st.lists(scalars, max_size=3), st.none(), st.integers(), st.booleans()),
)
def test_a_deploy_whose_template_is_not_an_object_is_refused(raw, template):
    raw["template"] = template
    try:
        wire_jobs.StackJob.from_wire(raw)
    except wire_jobs.InvalidBody as exc:
        assert str(exc) == "template must be an object"
    else:
        raise AssertionError("a template that is not an object was taken")


# ---- the template decoder (agent and renter API) ------------------------------------------


@FAST
@given(
    st.one_of(
        json_values,
        templates(),
        st.builds(lambda t, k, v: {**t, k: v}, templates(), st.sampled_from(TEMPLATE_KEYS), json_values),
    )
)
def test_template_decoder_takes_anything(raw):
    try:
        cleaned = wire_jobs.validate_template(raw)
    except wire_jobs.InvalidBody as exc:
        _check_refusal(exc)
        return
    _assert_usable_template(cleaned)
    assert set(cleaned) == set(TEMPLATE_KEYS)
    assert wire_jobs.validate_template(cleaned) == cleaned, "a cleaned template is taken as it is"


@FAST
@given(templates(), st.text(max_size=6), st.one_of(json_values, st.sampled_from(["\ud800", "a\x00b"])))
def test_every_variable_value_is_usable_text(template, name, value):
    template["environmentVariables"][name] = value
    try:
        cleaned = wire_jobs.validate_template(template)
    except wire_jobs.InvalidBody as exc:
        _check_refusal(exc)
        assert "environmentVariables" in str(exc)
        return
    assert cleaned["environmentVariables"][name] == value and isinstance(value, str)


# ---- the local marketplace's report decoders ----------------------------------------------


def _valid_status() -> dict:
    return {
        "status": wire.ERROR,
        "errorMsg": "boom",
        "pStackName": "web-1234abcd",
        "pStackId": 7,
        "jobId": "job-1",
        "assignedGPUs": ["GPU-1"],
        "reportedAt": wire_time.iso(),
    }


def _valid_containers() -> dict:
    return {
        "observedAt": wire_time.iso(),
        "containers": [{"Name": "/web", "Id": "abc", "State": "running", "Created": 1, "Labels": ["a=b"], "Ports": []}],
    }


def _valid_system_data() -> dict:
    return {
        "systemData": {"gpus": []},
        "fingerprint": "0123456789abcdef",
        "reportedAt": wire_time.iso(),
        "listing": {**dict.fromkeys(HARDWARE_FIELDS), "totalGPUs": 0, "totalRAM": 1.5},
        "compliance": {
            "isCompliant": False,
            "failedComplianceReason": "no GPU",
            "checks": [{"id": "nvidia-gpu", "ok": False, "summary": "no GPU", "remedy": "add one"}],
        },
    }


def _valid_init_state() -> dict:
    return {
        "state": "starting",
        "phase": "config",
        "phases": [{"name": "config", "state": "done", "startedAt": None, "finishedAt": None, "detail": None}],
        "error": None,
        "updatedAt": wire_time.iso(),
    }


def _valid_heartbeat() -> dict:
    return heartbeat(wire_time.iso())


REPORT_DECODERS = [
    (_status_problem, _valid_status),
    (_containers_problem, _valid_containers),
    (system_data_problem, _valid_system_data),
    (init_state_problem, _valid_init_state),
    (heartbeat_problem, _valid_heartbeat),
]


@st.composite
def mutated_reports(draw) -> tuple:
    """A decoder and a valid body of its kind with one nested field replaced by anything."""
    decoder, valid = draw(st.sampled_from(REPORT_DECODERS))
    body = valid()
    node = body
    while True:  # walk down a random path, then damage the node found there
        children = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
        containers = [key for key, value in children if isinstance(value, (dict, list)) and value]
        if not containers or draw(st.booleans()):
            break
        node = node[draw(st.sampled_from(containers))]
    if isinstance(node, dict):
        key = draw(st.one_of(st.sampled_from(sorted(node) or ["x"]), keys))
        if draw(st.integers(0, 4)) == 0:
            node.pop(key, None)
        else:
            node[key] = draw(json_values)
    elif node:
        node[draw(st.integers(0, len(node) - 1))] = draw(json_values)
    return decoder, body


def _problem(decoder, body):
    problem = decoder(body)
    assert problem is None or (isinstance(problem, str) and problem and len(problem) <= MAX_MESSAGE)
    return problem


@FAST
@given(st.sampled_from([decoder for decoder, _valid in REPORT_DECODERS]), json_values)
def test_report_decoders_take_anything(decoder, body):
    _problem(decoder, body)


@FAST
@given(mutated_reports())
def test_report_decoders_on_damaged_reports(case):
    decoder, body = case
    _problem(decoder, body)


def test_report_decoders_take_their_valid_bodies():
    for decoder, valid in REPORT_DECODERS:
        assert decoder(valid()) is None, decoder.__name__


# ---- the dispatcher: whatever arrives is run or refused, and the reply's other jobs run ----


async def _dispatch(raws: list, db: AgentDB | None = None) -> tuple[FakeDeployer, dict, list]:
    """Submit one poll's jobs (to a dispatcher on `db`, a new one by default); returns
    the deployer, the completions by job id and the stack statuses the marketplace would have received."""
    sent = Recorder()
    db = db if db is not None else AgentDB(None)
    outbox, deployer = Outbox(sent, db, base_delay=0.01), FakeDeployer()
    dispatcher = dispatcher_for(deployer, outbox, db=db)
    runner = asyncio.create_task(outbox.run())
    try:
        for raw in raws:
            dispatcher.submit(raw)  # must not raise, whatever raw is
        await dispatcher.shutdown(5)
        assert await outbox.drained(5)
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
    completions = {target: body for kind, target, body in sent.got if kind == JOB_COMPLETE}
    statuses = [(target, body) for kind, target, body in sent.got if kind == STATUS]
    return deployer, completions, statuses


def _good_remove(job_id: str) -> dict:
    return {
        "jobId": job_id,
        "type": wire.JOB_REMOVE,
        "stackId": "good-stack",
        "rentalId": "r1",
        "envId": "e1",
        "stackName": "web",
        "template": None,
        "rental": {"gpuCount": 0},
    }


@SLOWER
@given(st.one_of(json_values, mutated_jobs()))
def test_dispatcher_refuses_and_reports_bad_jobs_and_runs_the_others(raw):
    good_id = "good-job-after-a-bad-one"
    if isinstance(raw, dict) and raw.get("jobId") == good_id:
        return
    deployer, completions, statuses = asyncio.run(_dispatch([raw, _good_remove(good_id)]))
    assert good_id in deployer.ran and completions[good_id]["outcome"] == wire.OUTCOME_SUCCEEDED
    job = _decode(raw)
    raw_id = raw.get("jobId") if isinstance(raw, dict) else None
    if job is not None:
        assert job.job_id in deployer.ran and completions[job.job_id]["outcome"] == wire.OUTCOME_SUCCEEDED
        return
    if isinstance(raw_id, str) and SAFE_ID.fullmatch(raw_id):
        # Refused, and said so: a failed completion, and ERROR on the stack it names.
        assert raw_id not in deployer.ran
        completion = completions[raw_id]
        assert completion["outcome"] == wire.OUTCOME_FAILED
        assert completion["errorMsg"].startswith("job refused by the agent: ")
        stack_id = raw.get("stackId")
        if isinstance(stack_id, str) and SAFE_ID.fullmatch(stack_id):
            assert (stack_id, wire.ERROR, completion["errorMsg"]) in [
                (target, body["status"], body["errorMsg"]) for target, body in statuses
            ]
    assert deployer.ran == [good_id]


def test_dispatcher_refuses_each_kind_of_bad_job_with_a_reason():
    """Each kind of bad job, one by one, in one poll's reply with a good job."""
    good = _good_remove("job-good")
    deploy = {
        **good,
        "type": wire.JOB_DEPLOY,
        "stackId": "s-deploy",
        "template": {"name": "n", "description": "", "content": "services: {}\n", "environmentVariables": {}},
    }
    cases = {
        "job-type": ({**good, "type": "gpu.reset"}, "unknown job type 'gpu.reset'"),
        "job-template-str": ({**deploy, "template": "services: {}"}, "template must be an object"),
        "job-template-list": ({**deploy, "template": []}, "template must be an object"),
        "job-template-null": ({**deploy, "template": None}, "template must be an object"),
        "job-vars": (
            {**deploy, "template": {**deploy["template"], "environmentVariables": {"A": 1}}},
            "template.environmentVariables.A must be a string",
        ),
        "job-gpus-str": ({**deploy, "rental": {"gpuCount": "abc"}}, "rental.gpuCount must be a whole number"),
        "job-gpus-huge": ({**deploy, "rental": {"gpuCount": 10**30}}, "rental.gpuCount must be a whole number"),
        "job-gpus-neg": ({**deploy, "rental": {"gpuCount": -1}}, "rental.gpuCount must be a whole number"),
        "job-gpus-bool": ({**deploy, "rental": {"gpuCount": True}}, "rental.gpuCount must be a whole number"),
        "job-rental-list": ({**deploy, "rental": [1]}, "rental must be an object"),
        "job-name": ({**deploy, "stackName": ["web"]}, "stackName must be a string"),
        "job-stack": ({**good, "stackId": "../etc"}, "stackId must be an id"),
    }
    raws = [{**raw, "jobId": job_id} for job_id, (raw, _reason) in cases.items()]
    raws += [good, "not a job", None, {"jobId": "../x", "type": "gpu.reset"}]
    deployer, completions, statuses = asyncio.run(_dispatch(raws))
    assert deployer.ran == ["job-good"] and completions["job-good"]["outcome"] == wire.OUTCOME_SUCCEEDED
    for job_id, (_raw, reason) in cases.items():
        assert completions[job_id]["outcome"] == wire.OUTCOME_FAILED, job_id
        assert reason in completions[job_id]["errorMsg"], (job_id, completions[job_id]["errorMsg"])
    assert set(completions) == set(cases) | {"job-good"}, "a job without a usable id cannot be answered"
    assert {target for target, body in statuses if body["status"] == wire.ERROR} == {"s-deploy", "good-stack"}
