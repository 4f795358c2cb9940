"""Fixtures every test may use. Docker-only fixtures are in
tests/integration/conftest.py; helpers that are not fixtures are in support/.

tests/unit/ needs no Docker Engine and no network beyond loopback;
tests/integration/ runs against the real engine that `make test` starts.
"""

from __future__ import annotations

import io
import os

import aiohttp
import pytest

from gpuhost_agent.common import logs
from gpuhost_agent.local_marketplace import server
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.store import Store
from support.openapi_check import AGENT_DOC, LOCAL_DOC, load
from support.renter import Renter

logs.configure(os.environ.get("GPUHOST_TEST_LOG_LEVEL", "warning"), json_lines=True)


@pytest.fixture
async def market(tmp_path):
    """The marketplace alone (no agent): these tests are about its HTTP surface."""
    store = Store.load_or_create(tmp_path / "m.json", "renter-key")
    running = await server.start(MarketplaceState(store), "127.0.0.1", 0)
    async with aiohttp.ClientSession() as http:
        yield Renter(http, running.base_url, store)
    await running.stop()


@pytest.fixture(scope="module")
def agent_doc() -> dict:
    return load(AGENT_DOC)


@pytest.fixture(scope="module")
def local_doc() -> dict:
    return load(LOCAL_DOC)


@pytest.fixture
def log_stream():
    """All log output at debug level, as JSON lines, into a buffer; restored after."""
    stream = io.StringIO()
    logs.configure("debug", json_lines=True, stream=stream)
    try:
        yield stream
    finally:
        logs.configure("warning", json_lines=True)
