"""Whom a stream is refused to, and why (streams/admission.py): every refusal
of a stream past its parsing is made there, from Docker's labels and the
stream engine's answer of where the container runs, whatever the
environment; nothing in streams/ reads a Swarm key or imports a swarm module."""

from __future__ import annotations

import ast
from pathlib import Path

from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.engine.streams import ContainerAt, ContainerGone, EngineStreams, EngineUnreachable
from gpuhost_agent.streams import admission
from gpuhost_agent.streams.admission import admit, check_access
from gpuhost_agent.streams.requests import LogsRequest, Refusal, TerminalRequest, TunnelRequest, parse_request
from gpuhost_agent.uplink.session import SessionState

STREAMS = Path(admission.__file__).parent
BASE = {"streamId": "s-1", "rentalId": "r1", "stackId": "k1", "containerId": "c1"}
LABELS = {wire.LABEL_MANAGED: "true", wire.LABEL_ENV: "e", wire.LABEL_RENTAL: "r1", wire.LABEL_STACK: "k1"}
INFO = {"Id": "c" * 64, "Config": {"Labels": LABELS}, "State": {"Running": True}}


def test_access_needs_every_label():
    request = parse_request({"type": "logs", **BASE})
    good = {wire.LABEL_MANAGED: "true", wire.LABEL_ENV: "e", wire.LABEL_RENTAL: "r1", wire.LABEL_STACK: "k1"}
    assert check_access(good, "e", request) is None
    for key, value in [
        (wire.LABEL_MANAGED, "check"),
        (wire.LABEL_ENV, "other"),
        (wire.LABEL_RENTAL, "r2"),
        (wire.LABEL_STACK, "k2"),
    ]:
        refusal = check_access({**good, key: value}, "e", request)
        assert (refusal.status, refusal.error) == (404, "no such container in this stack")
    assert check_access(None, "e", request).status == 404


def test_no_access_while_the_environment_is_unknown():
    """Before a session names the environment, no container passes for this
    environment's: not one without an env label (None == None), not one with
    an empty one."""
    request = parse_request({"type": "logs", **BASE})
    unlabelled = {wire.LABEL_MANAGED: "true", wire.LABEL_RENTAL: "r1", wire.LABEL_STACK: "k1"}
    assert check_access(unlabelled, None, request).status == 404
    assert check_access({**unlabelled, wire.LABEL_ENV: ""}, "", request).status == 404
    assert check_access({**unlabelled, wire.LABEL_ENV: "e"}, None, request).status == 404


def _refusals_made(path: Path) -> list[ast.Call]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Refusal"
    ]


def test_every_refusal_of_a_stream_is_made_in_admission():
    """requests.py refuses what does not parse, with 400; every other reason
    to refuse a stream is admission's, so what a renter can reach reads in
    one place."""
    made = {path.name: _refusals_made(path) for path in sorted(STREAMS.glob("*.py"))}
    assert made["admission.py"] and made["requests.py"]
    for call in made.pop("requests.py"):
        status = call.args[1]
        assert isinstance(status, ast.Constant) and status.value == 400, ast.unparse(call)
    made.pop("admission.py")
    assert {name: [ast.unparse(call) for call in calls] for name, calls in made.items() if calls} == {}


def test_nothing_in_streams_reads_the_swarm_mode():
    """Where a container runs is the stream engine's answer (ContainerAt), not
    a key smuggled through its inspect nor a swarm module's."""
    for path in sorted(STREAMS.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
        imported += [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
        assert not [name for name in imported if "swarm" in name], path.name
        assert "REMOTE_NODE" not in path.read_text(encoding="utf-8"), path.name


class _Engine(EngineStreams):
    """An engine whose answer for the container is given: where it runs, or an error."""

    def __init__(self, answer: ContainerAt | Exception):
        super().__init__("unix:///nonexistent/docker.sock")
        self.answer = answer

    async def locate(self, container_id: str) -> ContainerAt:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


async def _no_stack(_stack_id: str) -> list[dict]:
    raise AssertionError("no SSH request here")


async def _admit(answer: ContainerAt | Exception, request) -> tuple[Refusal | None, dict, object]:
    return await admit(_Engine(answer), SessionState("e"), request, _no_stack)


async def test_a_container_whose_machine_is_unreachable_serves_its_log_alone():
    logs, terminal = LogsRequest("s-1", "r1", "k1", "c1"), TerminalRequest("s-2", "r1", "k1", "c1")
    tunnel = TunnelRequest("s-3", "r1", "k1", "c1", 8080)
    elsewhere = ContainerAt(INFO, machine="node-two-0123456789", unreachable="its agent did not answer")
    assert await _admit(elsewhere, logs) == (None, INFO, None)
    for request in (terminal, tunnel):
        refusal, _, service = await _admit(elsewhere, request)
        assert service is None and refusal == Refusal(
            request.stream_id, 409, "its agent did not answer (node node-two-012)"
        )
    assert await _admit(ContainerAt(INFO), terminal) == (None, INFO, None)  # one machine: always here
    stranger = ContainerAt({**INFO, "Config": {"Labels": {**LABELS, wire.LABEL_RENTAL: "r2"}}}, machine="n2")
    assert (await _admit(stranger, terminal))[0] == Refusal("s-2", 404, admission.NOT_IN_STACK)


async def test_an_engine_that_cannot_say_refuses_with_its_reason():
    terminal = TerminalRequest("s-2", "r1", "k1", "c1")
    assert (await _admit(ContainerGone("no such container"), terminal))[0] == Refusal(
        "s-2", 404, admission.NOT_IN_STACK
    )
    refusal = (await _admit(EngineUnreachable("down"), terminal))[0]
    assert refusal is not None and refusal.status == 503 and refusal.error == "Docker Engine: down"
