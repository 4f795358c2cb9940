"""Attacks on the big images' pulls and on the marketplace's upgrades. Each
xfail is a hole found; it passes once the hole is closed (strict: an
unexpected pass says so)."""

from __future__ import annotations

import asyncio
import hashlib
import stat
import threading
import time
from datetime import timedelta
from pathlib import Path

from aiohttp import web

from gpuhost_agent.core import upgrade_offers
from gpuhost_agent.core.images.pulls import ImagePulls
from gpuhost_agent.protocol import release_signature, wire, wire_time
from gpuhost_agent.runtime.image_manifest import ManifestSizes
from gpuhost_agent.service.upgrades import Upgrades
from gpuhost_agent.uplink.client import MarketplaceClient
from gpuhost_agent.uplink.replies import MarketplaceUnavailable

# ---------------------------------------------------------------------------
# `docker manifest inspect --verbose` output read whole into the agent.


class _Engine:
    async def info(self) -> dict:
        return {"RegistryConfig": {}}


async def test_manifest_output_is_bounded(tmp_path: Path):
    cli = await asyncio.to_thread(_fake_cli, tmp_path)
    sizes = ManifestSizes(_Engine(), tmp_path, docker_cli=str(cli))  # type: ignore[arg-type]
    size = await sizes.size("registry.example/team/huge:1", "registry.example")
    # A bounded reader gives up on an output this large ("size unknown"); the agent parsed all 48 MiB.
    assert size is None


def _fake_cli(tmp_path: Path) -> Path:
    padding = 48 * 1024 * 1024  # what a registry's oversized manifest list makes the CLI print
    cli = tmp_path / "docker"
    cli.write_text(
        "#!/usr/bin/env python3\nimport sys\n"
        'sys.stdout.write(\'{"SchemaV2Manifest": {"layers": [{"size": 1}]}, "pad": "\')\n'
        f"sys.stdout.write('A' * {padding})\nsys.stdout.write('\"}}')\n"
    )
    cli.chmod(cli.stat().st_mode | stat.S_IXUSR)
    return cli


# ---------------------------------------------------------------------------
# A pull nobody waits on any more runs on, unbounded in time and number.


def _drip(stop: threading.Event):
    """A registry that sends a byte now and then: never a stall, never an end."""

    def pull(reference, on_event, progress_mark, stall_seconds):
        current = 0
        while not stop.is_set():
            current += 1
            on_event({"status": "Downloading", "id": "l1", "progressDetail": {"current": current, "total": 10**12}})
            time.sleep(0.02)

    return pull


async def test_a_pull_no_deploy_waits_on_ends():
    stop = threading.Event()
    pulls = ImagePulls(_drip(stop), stall_seconds=0.3, report_seconds=0.05)
    try:
        deploy = asyncio.create_task(pulls.fetch(["evil.example/drip:1"], lambda text: None))
        await asyncio.sleep(0.2)
        deploy.cancel()  # the renter removes the stack / the rental ends
        await asyncio.gather(deploy, return_exceptions=True)
        await asyncio.sleep(1.5)  # five stall bounds later
        assert "evil.example/drip:1" not in pulls._flights  # noqa: SLF001
        assert not pulls._running  # noqa: SLF001 - the pull itself ended (its engine request closed), not just forgotten
    finally:
        stop.set()


async def test_one_rental_cannot_hold_every_pull_slot():
    stop = threading.Event()
    pulls = ImagePulls(_drip(stop), stall_seconds=0.3, report_seconds=0.05)
    deploys = []
    try:
        for round_ in range(4):  # four deploys of one rental, each cancelled, 32 new tags each
            images = [f"evil.example/drip:{round_}-{i}" for i in range(32)]
            deploys.append(asyncio.create_task(pulls.fetch(images, lambda text: None)))
            await asyncio.sleep(0.05)
            deploys[-1].cancel()
        await asyncio.gather(*deploys, return_exceptions=True)
        await asyncio.sleep(0.5)
        assert len(pulls._flights) <= 16  # noqa: SLF001 - any per-host bound would do
        assert pulls.started <= 3 * 4, pulls.started  # at most the host's slots each round
    finally:
        stop.set()


# ---------------------------------------------------------------------------
# The agent's API key follows a redirect to another origin.


async def _serve(path: str, handler) -> tuple[web.AppRunner, int]:
    """One GET route on a loopback port of its own."""
    app = web.Application()
    app.router.add_get(path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


# Fixed in bcc23e4: the client follows no redirect.
async def test_a_redirect_never_carries_the_api_key_elsewhere():
    seen: list[dict] = []
    body = b"wheel"

    async def other(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.Response(body=body)

    other_runner, other_port = await _serve("/steal", other)

    async def release(request: web.Request) -> web.Response:
        raise web.HTTPFound(f"http://127.0.0.1:{other_port}/steal")

    runner, port = await _serve("/agent/releases/gpuhost_agent-9.9.9-py3-none-any.whl", release)
    client = MarketplaceClient(f"http://127.0.0.1:{port}", "SECRET-ENV-KEY")
    client.session_id = "SESSION-1"
    try:
        try:
            await client.download("/agent/releases/gpuhost_agent-9.9.9-py3-none-any.whl", 100)
        except Exception:  # noqa: BLE001 - refusing the redirect is the fix
            pass
        leaked = [h for h in seen if h.get(wire.API_KEY_HEADER) or h.get(wire.SESSION_HEADER)]
        assert not leaked, leaked
    finally:
        await client.close()
        await runner.cleanup()
        await other_runner.cleanup()


# ---------------------------------------------------------------------------
# Two alternating offers defeat the retry pause of a failed fetch.


class _FailingClient:
    def __init__(self) -> None:
        self.fetches: list[str] = []

    async def download(self, path: str, size: int) -> bytes:
        self.fetches.append(path)
        raise MarketplaceUnavailable("no")


RELEASE_KEY = release_signature.new_private()


def _offer(version: str) -> dict:
    sha = hashlib.sha256(version.encode()).hexdigest()
    not_after = release_signature.void_after(wire_time.utcnow() + timedelta(days=1))
    signature = release_signature.sign(RELEASE_KEY, release_signature.Signed(version, sha, 1000, not_after))
    return {"version": version, "path": f"/agent/releases/a-{version}.whl", "sha256": sha, "size": 1000,
            "notAfter": not_after, "signature": signature}  # fmt: skip


# Fixed in bcc23e4: every failed offer waits out the pause.
async def test_alternating_offers_are_still_retried_once_per_pause(tmp_path: Path):
    client = _FailingClient()
    policy = upgrade_offers.Policy(key=release_signature.public_text(RELEASE_KEY.public_key()))
    upgrades = Upgrades(tmp_path, client, "0.1.0", 60, asyncio.Event(), supervised=True, policy=policy)  # type: ignore[arg-type]
    for beat in range(6):
        upgrades.offered({"agentRelease": _offer("1.0.0" if beat % 2 else "2.0.0")})
        if upgrades._task is not None:  # noqa: SLF001
            await upgrades._task  # noqa: SLF001
    assert 1 <= len(client.fetches) <= 2, client.fetches


# ---------------------------------------------------------------------------
# A kept image recorded under the renter's spelling is never evicted.


class _TagsEngine:
    """The engine's inventory keys images by RepoTags, normalised by dockerd."""

    def __init__(self) -> None:
        self.images = {"busybox:latest": ("sha256:b", 5 * 10**9), "python:3.12": ("sha256:p", 5 * 10**9)}
        self.removed: list[str] = []

    async def image_inventory(self):
        return dict(self.images), set()

    async def image_id(self, reference: str) -> str | None:
        """What inspect answers: the engine resolves any spelling (added with the fix)."""
        spellings = {"busybox": "sha256:b", "docker.io/library/python:3.12": "sha256:p"}
        return spellings.get(reference)

    async def remove_image(self, reference: str) -> None:
        self.removed.append(reference)


async def test_images_recorded_in_any_spelling_can_be_evicted(tmp_path: Path):
    from gpuhost_agent.core.images.cache import ImageCache

    engine = _TagsEngine()

    async def room():
        return 1 * 10**9, 20 * 10**9  # 1 GB free, floor 20 GB: everything kept should go

    cache = ImageCache(engine, tmp_path / "images.json", room)  # type: ignore[arg-type]
    await cache.pulled(["busybox", "docker.io/library/python:3.12"])
    await cache.make_room()
    assert engine.removed, "nothing evicted: both references were forgotten"
    assert sorted(engine.removed) == ["sha256:b", "sha256:p"]  # by id, each once
