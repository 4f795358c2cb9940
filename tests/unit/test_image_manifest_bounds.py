"""The size check reads the docker CLI through bounds
(runtime/image_manifest.py): its output capped, its errors' tail only, a
bounded number at once, the reference after `--`, and a CLI that never
answers is killed at the bound. The CLI here is a real process standing in
for `docker` (the renter's registry decides what the real one prints)."""

from __future__ import annotations

import asyncio
import json
import stat
import time
from pathlib import Path

from gpuhost_agent.runtime import image_manifest
from gpuhost_agent.runtime.image_manifest import ManifestSizes

MANIFEST = {"SchemaV2Manifest": {"layers": [{"size": 3}, {"size": 4}]}}


class Engine:
    async def info(self) -> dict:
        return {"RegistryConfig": {}}


async def fake_cli(tmp_path: Path, body: str) -> Path:
    return await asyncio.to_thread(_write_cli, tmp_path, body)


def _write_cli(tmp_path: Path, body: str) -> Path:
    cli = tmp_path / "docker"
    cli.write_text("#!/usr/bin/env python3\nimport json, os, sys, time\n" + body)
    cli.chmod(cli.stat().st_mode | stat.S_IXUSR)
    return cli


async def test_the_reference_comes_after_a_double_dash_and_the_size_is_read(tmp_path: Path):
    log = tmp_path / "args"
    cli = await fake_cli(
        tmp_path,
        f"open({str(log)!r}, 'w').write(json.dumps(sys.argv[1:]))\nprint(json.dumps({MANIFEST!r}))\n",
    )
    size = await ManifestSizes(Engine(), tmp_path, docker_cli=str(cli)).size("--help", None)  # type: ignore[arg-type]
    assert size == 7
    assert json.loads(await asyncio.to_thread(log.read_text)) == ["manifest", "inspect", "--verbose", "--", "--help"]


async def test_a_cli_that_never_answers_is_killed_at_the_bound(tmp_path: Path):
    cli = await fake_cli(tmp_path, "sys.stderr.write('E' * 10_000_000)\ntime.sleep(60)\n")
    sizes = ManifestSizes(Engine(), tmp_path, timeout=0.5, docker_cli=str(cli))  # type: ignore[arg-type]
    started = time.monotonic()
    assert await sizes.size("registry.example/x:1", None) is None
    assert time.monotonic() - started < 5


async def test_only_a_few_size_checks_run_at_once(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(image_manifest, "CONCURRENT_CHECKS", 2)
    running = tmp_path / "running"
    await asyncio.to_thread(running.mkdir)
    cli = await fake_cli(
        tmp_path,
        f"d = {str(running)!r}\nopen(os.path.join(d, str(os.getpid())), 'w').close()\n"
        "peak = len(os.listdir(d))\ntime.sleep(0.3)\nos.unlink(os.path.join(d, str(os.getpid())))\n"
        f"m = {MANIFEST!r}\nm['SchemaV2Manifest']['layers'][0]['size'] = peak\nprint(json.dumps(m))\n",
    )
    sizes = ManifestSizes(Engine(), tmp_path, docker_cli=str(cli))  # type: ignore[arg-type]
    found = await asyncio.gather(*(sizes.size(f"registry.example/x:{i}", None) for i in range(6)))
    assert all(size is not None and size - 4 <= 2 for size in found), found  # at most 2 CLIs at a time


def test_the_size_checks_cli_goes_through_the_pull_guard_and_reads_the_engines_own_spelling() -> None:
    """The Engine API's /info spells its proxies HttpProxy and
    HttpsProxy; the CLI was given none (HTTPProxy was read), so it resolved the renter's
    registry itself, around the guard. With the guard on, the CLI goes through it."""
    from gpuhost_agent.runtime.image_manifest import proxy_environment

    info = {"HttpProxy": "http://proxy.corp:3128", "HttpsProxy": "http://proxy.corp:3129", "NoProxy": "10.0.0.0/8"}
    assert proxy_environment(info) == {
        "HTTP_PROXY": "http://proxy.corp:3128",
        "HTTPS_PROXY": "http://proxy.corp:3129",
        "NO_PROXY": "10.0.0.0/8",
    }
    guarded = proxy_environment(info, "http://127.0.0.1:47128")
    assert (guarded["HTTP_PROXY"], guarded["HTTPS_PROXY"]) == ("http://127.0.0.1:47128",) * 2
