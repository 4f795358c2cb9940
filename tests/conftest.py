"""Fixtures every test may use. Docker-only fixtures are in
tests/integration/conftest.py; helpers that are not fixtures are in support/.

tests/unit/ needs no Docker Engine and no network beyond loopback;
tests/integration/ runs against the real engine that `make test` starts.
"""

from __future__ import annotations

import functools
import inspect
import io
import os
import traceback
import types
from pathlib import Path

import aiohttp
import pytest
from blockbuster import BlockBuster, BlockingError
from support.openapi_check import AGENT_DOC, LOCAL_DOC, load
from support.renter import Renter

import gpuhost_agent
from gpuhost_agent.common import logs
from gpuhost_agent.local_marketplace import server
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.storage.agent_db import AgentDB

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


# Blocking calls accepted on the event loop, on purpose. Each entry: a file
# ending, its functions under which the call is let through, the blocking calls
# let through (None: any), and why.
_RMTREE = {"os.scandir", "os.stat", "os.path.samestat", "os.path.islink", "os.unlink", "os.rmdir"}
ACCEPTED_BLOCKING = [
    (
        "gpuhost_agent/storage/agent_db.py",
        set(vars(AgentDB)),
        None,
        "the state database: small SQLite transactions committed before the report or completion they record is"
        " queued, so the record is never behind the marketplace (an order a thread hop would give up)",
    ),
    (
        "gpuhost_agent/core/stacks/deployer.py",
        {"_teardown", "remove", "_end_rental_once"},
        _RMTREE,
        "shutil.rmtree of a stack's working directory (two small files), in line with the ERROR/REMOVED report"
        " that follows it, so that no cancellation can fall between the two",
    ),
    (
        "gpuhost_agent/service/wiring.py",
        {"build_agent"},
        None,
        "the composition root, once at start-up before anything is served: opens the database, creates the state"
        " directories, imports the legacy GPU file",
    ),
    ("gpuhost_agent/core/stacks/deployer.py", {"__init__"}, None, "creates the stacks directory, once at start-up"),
    ("gpuhost_agent/runtime/compose.py", {"__init__"}, None, "creates Compose's config directory, once at start-up"),
    ("gpuhost_agent/core/gpus/ledger.py", {"import_legacy"}, None, "reads the pre-database GPU file, once at start-up"),
    (
        "gpuhost_agent/service/status/server.py",
        {"_prepare_socket_path", "stop"},
        None,
        "the status socket's directory and a stale socket's removal, at start and stop only",
    ),
    (
        "gpuhost_agent/local_marketplace/store.py",
        {"save", "load_or_create"},
        None,
        "the local marketplace (a development stand-in for the real one) keeps its state in one small JSON file,"
        " written whole after each change before the answer goes out",
    ),
    (
        "gpuhost_agent/local_marketplace/script_api.py",
        {"checkout_install_script"},
        None,
        "looks for the checkout's install.sh once, when the local marketplace's app is built",
    ),
    (
        "logging/__init__.py",
        {"emit", "flush"},
        None,
        "a log line is written whole, synchronously, by the handler that takes it (the agent's own lines go the"
        " same way through structlog); since libraries' records reach the root logger, pytest's own file handler"
        " writes them too",
    ),
    (
        "tests/unit/test_sd_notify.py",
        {"test_a_blocked_event_loop_stops_the_pings"},
        {"time.sleep"},
        "blocks the loop on purpose: a hung loop must stop the watchdog's pings",
    ),
]

# The code whose blocking calls fail a test: the agent and the local marketplace,
# and the tests themselves (test modules, fixtures and tests/support helpers).
_TESTS = types.ModuleType("tests")
_TESTS.__path__ = [str(Path(__file__).resolve().parent) + os.sep]


@functools.cache
def _watcher() -> BlockBuster:
    """One BlockBuster for the session, its exceptions set once: it is switched on
    around each async test. Built per test, it cost a millisecond or two each,
    over a thousand async tests."""
    watcher = BlockBuster([gpuhost_agent, _TESTS])
    for path, functions, calls, _why in ACCEPTED_BLOCKING:
        for name, function in watcher.functions.items():
            if calls is None or name in calls:
                function.can_block_in(path, functions)
    return watcher


@pytest.fixture(autouse=True)
def blockbuster(request, monkeypatch):
    """Fails an async test, or its async fixtures, when their code (or the agent's
    code they run) makes a blocking call on the event loop: file I/O, os.stat,
    SQLite, time.sleep, a blocking socket (blockbuster patches these in the loop's
    thread only; work handed to asyncio.to_thread is not checked). Fix it with
    asyncio.sleep / asyncio.to_thread, or add it to ACCEPTED_BLOCKING with why.

    The call raises BlockingError where it is made; one raised in a task of the
    agent that catches and logs its errors is still reported, at teardown."""
    if not inspect.iscoroutinefunction(request.function):
        yield None
        return
    raised: list[str] = []
    created = BlockingError.__init__

    def remember(error: BlockingError, func: str) -> None:
        created(error, func)
        raised.append(f"Blocking call to {func}\n" + "".join(traceback.format_stack(limit=14)[:-1]))

    monkeypatch.setattr(BlockingError, "__init__", remember)
    watcher = _watcher()
    watcher.activate()
    try:
        yield watcher
    finally:
        watcher.deactivate()
    if raised:
        pytest.fail(f"{len(raised)} blocking call(s) on the event loop; the first:\n{raised[0]}", pytrace=False)
