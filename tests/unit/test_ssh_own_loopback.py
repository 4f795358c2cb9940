"""An SSH `-L`/`-D` to localhost: which destinations name
the login's container's own loopback (streams/tunnel.py, own_loopback), and
what streams/admission.py's connect_own_loopback dials or refuses, with a
dial of our own in place of runtime/netns_dial.py (which
tests/unit/test_netns_dial.py and tests/integration/test_ssh_loopback.py
run for real)."""

from __future__ import annotations

import asyncio

import pytest

from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.engine.streams import ContainerAt
from gpuhost_agent.runtime.netns_dial import NetnsError
from gpuhost_agent.streams.admission import ELSEWHERE, NOT_IN_STACK, connect_own_loopback
from gpuhost_agent.streams.requests import Refusal, TunnelRequest
from gpuhost_agent.streams.tunnel import own_loopback

LABELS = {wire.LABEL_MANAGED: "true", wire.LABEL_ENV: "e", wire.LABEL_RENTAL: "r1", wire.LABEL_STACK: "k1"}
INFO = {"Id": "c" * 64, "Config": {"Labels": LABELS}, "State": {"Running": True, "Pid": 4242}}
REQUEST = TunnelRequest("s-1", "r1", "k1", "c" * 64, 8888)


def test_localhost_and_loopback_literals_name_the_containers_loopback() -> None:
    assert own_loopback("localhost") == own_loopback("LOCALHOST.") == ("127.0.0.1", "::1")
    assert own_loopback("127.0.0.1") == ("127.0.0.1",)
    assert own_loopback("127.1.2.3") == ("127.1.2.3",)
    assert own_loopback("::1") == own_loopback("[::1]") == ("::1",)
    for other in (
        "web",
        "172.17.0.1",
        "0.0.0.0",
        "::",
        "::ffff:127.0.0.1",
        "localhost.example.org",
        "",
        "127.0.0.1:22",
    ):
        assert own_loopback(other) == (), other


class _Dial:
    """Answers in turn; records what was asked."""

    def __init__(self, *answers: BaseException | str):
        self.answers, self.asked = list(answers), []

    async def __call__(self, pid: int, address: str, port: int, timeout: float, *, container_id: str) -> object:
        self.asked.append((pid, address, port, container_id))
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer


async def _connect(container: ContainerAt, dial: _Dial, addresses=("127.0.0.1", "::1")) -> object:
    return await connect_own_loopback(container, REQUEST, "e", addresses, dial=dial, timeout=1)


async def test_dialled_in_the_logins_own_container_by_its_pid_and_id() -> None:
    dial = _Dial(ConnectionRefusedError(), "connected")
    assert await _connect(ContainerAt(INFO), dial) == "connected"  # IPv4 refused, then IPv6
    assert dial.asked == [(4242, "127.0.0.1", 8888, "c" * 64), (4242, "::1", 8888, "c" * 64)]


async def test_every_address_failing_says_each_reason() -> None:
    dial = _Dial(ConnectionRefusedError(), OSError(99, "Cannot assign requested address"))
    refusal = await _connect(ContainerAt(INFO), dial)
    assert isinstance(refusal, Refusal) and refusal.status == 503
    assert refusal.error == (
        "cannot connect to port 8888 on the container's own loopback: 127.0.0.1: nothing listens there;"
        " ::1: Cannot assign requested address"
    )
    host_ns = NetnsError(1, "the container shares the host's network: no connection is made in it")
    refusal = await _connect(ContainerAt(INFO), _Dial(host_ns, asyncio.TimeoutError()))
    assert "127.0.0.1: the container shares the host's network" in refusal.error
    assert "::1: no answer within 1 s" in refusal.error


@pytest.mark.parametrize(
    ("container", "expected"),
    [
        (ContainerAt({**INFO, "Config": {"Labels": {**LABELS, wire.LABEL_RENTAL: "r2"}}}), (404, NOT_IN_STACK)),
        (ContainerAt({**INFO, "Config": {"Labels": {**LABELS, wire.LABEL_ENV: "x"}}}), (404, NOT_IN_STACK)),
        (ContainerAt(INFO, machine="n2", unreachable="its agent did not answer"), (409, "its agent did not answer")),
        (ContainerAt(INFO, machine="n2"), (501, ELSEWHERE)),
        (ContainerAt({**INFO, "State": {"Running": False, "Pid": 0}}), (503, "the container is not running")),
        (ContainerAt({**INFO, "State": {"Running": True, "Pid": True}}), (503, "the container is not running")),
        (ContainerAt({**INFO, "State": {"Running": True}}), (503, "the container is not running")),
    ],
)
async def test_refused_before_any_dial(container: ContainerAt, expected: tuple[int, str]) -> None:
    dial = _Dial()
    refusal = await _connect(container, dial)
    assert isinstance(refusal, Refusal) and (refusal.status, refusal.error) == expected
    assert dial.asked == []
