"""A renter's image never makes the host's engine fetch from the host.

dockerd pulls in the host's network namespace and speaks plain HTTP to a
loopback registry, and it quoted a reply it could not parse in the deploy's
error: `image: 127.0.0.1:<port>/any/path:tag` read a host loopback service
back to the renter. A tiny HTTP server on 127.0.0.1 stands for such a
service. Through the local marketplace and the agent on the real engine: a
deploy naming it (in several spellings) is refused by the policy and the
server sees no request; a host that allows it as a registry
(GPUHOST_ALLOWED_REGISTRIES) lets the engine ask it, and its reply still
does not reach the renter's errorMsg.
"""

from __future__ import annotations

import asyncio
import http.server
import threading

import aiohttp
import pytest
from support.agent_config import make_config
from support.engine import env_containers, remove_env_resources
from support.renter import Renter

from gpuhost_agent.protocol import wire
from gpuhost_agent.service.daemon import stop_agent
from gpuhost_agent.service.wiring import build_agent, start_local_marketplace

SECRET = "HOST-LOOPBACK-SECRET"


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.server.paths.append(self.path)  # type: ignore[attr-defined]
        body = f"{SECRET} path={self.path}".encode()
        self.send_response(404)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def loopback_service():
    """(port, the paths it was asked for): a host service on 127.0.0.1."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.paths = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], server.paths  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()


async def _deploy(renter: Renter, image: str) -> dict:
    rental_id = await renter.rental()
    content = f'services:\n  app:\n    image: "{image}"\n    command: ["sleep", "3600"]\n'
    stack_id = await renter.stack(rental_id, content)
    return await renter.wait_stack(rental_id, stack_id, (wire.ERROR, wire.APPLIED), timeout=40)


async def test_a_registry_on_the_hosts_loopback_is_refused_and_never_asked(
    local_market, docker_client, loopback_service
):
    renter, _parts, _local = local_market
    port, paths = loopback_service
    for image in (
        f"127.0.0.1:{port}/internal/anything/the/renter/chooses:tag",
        f"localhost:{port}/x:1",
        f"127.1:{port}/x:1",
        f"[::ffff:127.0.0.1]:{port}/x:1",
    ):
        stack = await _deploy(renter, image)
        message = stack["errorMsg"]
        assert stack["status"] == wire.ERROR, (image, stack)
        assert "refused by the sandbox policy" in message and f"service \"app\": image '{image}'" in message, message
        assert SECRET not in message
    assert paths == [], "the host's engine asked the loopback service"
    assert await asyncio.to_thread(env_containers, docker_client, renter.store.envId) == []


async def test_an_allowed_local_registry_is_asked_but_its_reply_is_not_read_back(
    tmp_path, docker_client, loopback_service
):
    port, paths = loopback_service
    config = make_config(tmp_path / "state", allowed_registries=("127.0.0.1:5000", f"127.0.0.1:{port}"))
    local = await start_local_marketplace(config)
    parts = build_agent(config, local.base_url, local.state.store.envApiKey)
    agent_task = asyncio.create_task(parts.agent.run())
    http = aiohttp.ClientSession()
    try:
        await asyncio.wait_for(parts.session.connected.wait(), 10)
        renter = Renter(http, local.base_url, local.state.store)
        image = f"127.0.0.1:{port}/internal/anything:tag"
        stack = await _deploy(renter, image)
        assert stack["status"] == wire.ERROR, stack
        assert paths, "the allowed registry was not asked: the test shows nothing"
        assert f"service 'app' could not get its image '{image}'" in stack["errorMsg"], stack["errorMsg"]
        assert SECRET not in stack["errorMsg"] and "path=" not in stack["errorMsg"], stack["errorMsg"]
    finally:
        await http.close()
        await stop_agent(parts, agent_task)
        await local.stop()
        await asyncio.to_thread(remove_env_resources, docker_client, local.state.store.envId)
