"""Which requests the worker's door (streams/door.py) lets the leader make
of its engine: a pure decision, checked here on paths as docker-py and the
Docker CLI write them; the door itself runs against the real engine in
tests/integration/test_door_engine.py."""

from __future__ import annotations

import aiohttp
import pytest
from support.door_tls import DoorTls, make_door_tls

from gpuhost_agent.protocol import wire
from gpuhost_agent.runtime.engine.client import EngineError
from gpuhost_agent.runtime.engine.streams import EngineStreams
from gpuhost_agent.runtime.swarm_stacks import rental_disk_figures
from gpuhost_agent.streams.door import WorkerDoor
from gpuhost_agent.streams.door_routes import route

ID = "5e7140ba6f17c65a09300a61fbb9e36a520b40a8869c52175d0f97f718ab2a59"


@pytest.fixture
def door_tls(tmp_path) -> DoorTls:
    """The environment's CA, the leader's and a worker's certificates (service/swarm_tls.py)."""
    return make_door_tls(tmp_path)


@pytest.mark.parametrize(
    ("method", "target", "expected"),
    [
        ("GET", f"/containers/{ID}/json", ("container", ID)),
        ("GET", f"/v1.41/containers/{ID}/logs?follow=1&stdout=1", ("container", ID)),
        ("POST", f"/containers/{ID}/exec", ("container", ID)),
        ("POST", f"/v1.43/exec/{ID}/start", ("exec", ID)),
        ("POST", f"/exec/{ID}/resize?h=24&w=80", ("exec", ID)),
        ("GET", f"/exec/{ID}/json", ("exec", ID)),
        ("GET", "/containers/json", None),  # the host's whole container list
        ("POST", "/containers/create", None),
        ("POST", f"/containers/{ID}/start", None),
        ("DELETE", f"/containers/{ID}", None),
        ("GET", f"/containers/{ID}/archive?path=/", None),  # files: not through this door
        ("POST", f"/containers/{ID}/attach", None),
        ("GET", f"/containers/../images/{ID}/json", None),
        ("GET", f"/containers/{ID}/json/../../info", None),
        ("PUT", f"/containers/{ID}/json", None),
        ("GET", "/info", None),
        ("POST", "/swarm/leave", None),
        ("POST", f"/gpuhost/containers/{ID}/connect?address=10.0.1.5&port=80", ("connect", ID)),
        ("POST", f"/gpuhost/containers/{ID}/files", ("files", ID)),
        ("POST", f"/gpuhost/exec/{ID}/hangup", ("hangup", ID)),
        ("POST", f"/gpuhost/exec/{ID}/signal?number=2", ("signal", ID)),
        ("GET", "/gpuhost/machine", ("machine", "")),
        ("POST", "/gpuhost/machine", None),
        ("GET", "/v1.45/gpuhost/disk", ("disk", "")),
        ("POST", "/gpuhost/disk", None),
        ("GET", f"/gpuhost/containers/{ID}/files", None),
        ("GET", "/gpuhost/machine/../../info", None),
    ],
)
def test_only_a_managed_containers_inspect_log_and_execs_are_routed(method, target, expected) -> None:
    assert route(method, target) == expected


def test_a_short_key_is_refused_at_the_start() -> None:
    with pytest.raises(ValueError, match="at least 16"):
        WorkerDoor("short", None, "/var/run/docker.sock", tls=None)  # type: ignore[arg-type]


_TLS: dict[str, DoorTls] = {}


@pytest.fixture(autouse=True)
def _door_tls(door_tls) -> None:
    _TLS["door"] = door_tls


async def _get_machine(
    proxy: WorkerDoor, key: str, query: str = "", path: str = "/gpuhost/machine"
) -> tuple[int, dict]:
    port = await proxy.start("127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=_TLS["door"].client())) as http:
            headers = {"Authorization": f"Bearer {key}"}
            async with http.get(f"https://127.0.0.1:{port}{path}{query}", headers=headers) as answer:
                return answer.status, await answer.json()
    finally:
        await proxy.stop()


class _Report:
    """A machine's report (MachineReport's two answers)."""

    def __init__(self, fails: bool = False) -> None:
        self.fails = fails

    async def current(self) -> dict:
        if self.fails:
            raise RuntimeError("the engine went away")
        return {"systemData": {"hostname": "gpu-2"}, **await self.live()}

    async def live(self) -> dict:
        return {"telemetry": {"gpus": []}}


async def test_the_machines_report_is_served_with_the_key_and_a_failed_probe_is_said() -> None:
    key = "k" * 20
    engine = EngineStreams("unix:///nonexistent/docker.sock")  # the route never reaches the engine
    try:
        whole = await _Report().current()
        assert await _get_machine(
            WorkerDoor(key, engine, "/nonexistent", tls=_TLS["door"].server(), machine=_Report()), key
        ) == (200, whole)
        live = await _get_machine(
            WorkerDoor(key, engine, "/nonexistent", tls=_TLS["door"].server(), machine=_Report(fails=True)),
            key,
            "?live=1",
        )
        assert live == (200, {"telemetry": {"gpus": []}})  # the figures alone: no probe
        assert (
            await _get_machine(
                WorkerDoor(key, engine, "/nonexistent", tls=_TLS["door"].server(), machine=_Report()), "x" * 20
            )
        )[0] == 401
        status, body = await _get_machine(
            WorkerDoor(key, engine, "/nonexistent", tls=_TLS["door"].server(), machine=_Report(fails=True)), key
        )
        assert status == 503 and "RuntimeError: the engine went away" in body["message"]
        status, _ = await _get_machine(WorkerDoor(key, engine, "/nonexistent", tls=_TLS["door"].server()), key)
        assert status == 404
    finally:
        await engine.close()


async def test_the_machines_disk_figures_are_served_and_an_engine_that_fails_is_said() -> None:
    key = "k" * 20
    engine = EngineStreams("unix:///nonexistent/docker.sock")
    figures = {"Containers": [], "Volumes": [{"Labels": {"com.docker.stack.namespace": "p"}, "UsageData": {"Size": 5}}]}

    async def disk() -> dict:
        return figures

    async def broken() -> dict:
        raise EngineError("Docker Engine did not answer within 35s")

    try:
        proxy = WorkerDoor(key, engine, "/nonexistent", tls=_TLS["door"].server(), disk=disk)
        assert await _get_machine(proxy, key, path="/gpuhost/disk") == (200, figures)
        status, body = await _get_machine(
            WorkerDoor(key, engine, "/nonexistent", tls=_TLS["door"].server(), disk=broken), key, path="/gpuhost/disk"
        )
        assert status == 503 and "did not answer within 35s" in body["message"]
        assert (
            await _get_machine(
                WorkerDoor(key, engine, "/nonexistent", tls=_TLS["door"].server()), key, path="/gpuhost/disk"
            )
        )[0] == 404
    finally:
        await engine.close()


def test_the_disk_figures_hold_the_agents_containers_and_the_stacks_volumes_alone() -> None:
    managed = {wire.LABEL_MANAGED: "true", wire.LABEL_RENTAL: "r1", wire.LABEL_STACK: "s1", "secret": "x"}
    df = {
        "Containers": [
            {"Labels": managed, "SizeRw": 10, "Names": ["/p_train.1"]},
            {"Labels": {"com.example.host": "1"}, "SizeRw": 999},  # the host's own
        ],
        "Volumes": [
            {"Name": "p_data", "Labels": {"com.docker.stack.namespace": "p"}, "UsageData": {"Size": 7}},
            {"Name": "host-db", "Labels": None, "UsageData": {"Size": 5}},
        ],
        "Images": [{"Id": "sha256:1"}],
    }
    assert rental_disk_figures(df) == {
        "Containers": [{"Labels": {wire.LABEL_RENTAL: "r1"}, "SizeRw": 10}],
        "Volumes": [{"Labels": {"com.docker.stack.namespace": "p"}, "UsageData": {"Size": 7}}],
    }
