"""An image's size before it is pulled, from its registry's manifest (issue
34): the sum of its layers' compressed sizes, for linux/amd64 where the
reference names a list of platforms.

The engine has no endpoint that says it (`/distribution/{name}/json` gives
the manifest's own descriptor and platforms, not its layers), so the docker
CLI asks the registry: `docker manifest inspect --verbose`, run as every
host program of the agent's is (runtime/host_process.py: its own empty
DOCKER_CONFIG, so no credential of the host's is sent), through the
engine's own proxy settings. It contacts only the
registry the sandbox already let the engine contact (and the token service
that registry names, as the engine's own pull would), `--insecure` only for
a registry the engine itself treats as insecure (its RegistryConfig), and
nothing it reads reaches the renter but the number. Anything that goes
wrong (no docker CLI, a registry that refuses, a format it cannot read)
means "size unknown": the pull then goes ahead unchecked, as before.

The registry is the renter's to choose, so what the CLI prints is read
through a cap (MAX_OUTPUT: a manifest list the registry made huge kills the
CLI, size unknown), only the tail of its errors is kept, at most
CONCURRENT_CHECKS run at once whatever the stacks ask, and the reference
comes after `--`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import shutil
from collections.abc import Callable
from pathlib import Path

from gpuhost_agent.common.logs import get_logger
from gpuhost_agent.runtime.engine.client import DockerEngine, EngineError
from gpuhost_agent.runtime.host_process import DIE_WITH_AGENT, host_environment, kill

log = get_logger(__name__)

INSPECT_SECONDS = 20.0
MAX_OUTPUT = 4 * 1024 * 1024  # bytes of the CLI's output; Docker Hub's largest manifest lists print well under 1 MiB
ERROR_TAIL = 2000  # bytes of the CLI's errors kept (the log line quotes 200 characters)
CONCURRENT_CHECKS = 4  # size checks at once, for every deploy together
CHUNK = 65536


async def read_capped(stream: asyncio.StreamReader, cap: int, over: Callable[[], object]) -> bytes | None:
    """The whole stream, or None when it passed `cap` bytes: `over` is then
    called (it kills the writer) and the rest read to its end and dropped,
    so the pipe closes and the process can be reaped."""
    chunks: list[bytes] | None = []
    size = 0
    while chunk := await stream.read(CHUNK):
        size += len(chunk)
        if chunks is not None and size > cap:
            chunks = None
            over()
        elif chunks is not None:
            chunks.append(chunk)
    return None if chunks is None else b"".join(chunks)


def _kill_quietly(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        try:
            process.kill()
        except ProcessLookupError:
            pass


async def read_tail(stream: asyncio.StreamReader, keep: int) -> bytes:
    """The stream's last `keep` bytes (all of it read, none of it kept past that)."""
    tail = b""
    while chunk := await stream.read(CHUNK):
        tail = (tail + chunk)[-keep:]
    return tail


def _layers_size(manifest: object) -> int | None:
    layers = manifest.get("layers") if isinstance(manifest, dict) else None
    if not isinstance(layers, list) or not layers:
        return None
    sizes = [layer.get("size") for layer in layers if isinstance(layer, dict)]
    if len(sizes) != len(layers) or not all(isinstance(s, int) and s >= 0 for s in sizes):
        return None
    return sum(sizes)  # type: ignore[arg-type]


def manifest_size(printed: str, arch: str = "amd64") -> int | None:
    """The compressed size of the image `docker manifest inspect --verbose`
    printed: one entry (a plain manifest), or a list of them (a manifest
    list: the linux/`arch` one). None when it cannot be told."""
    try:
        found = json.loads(printed)
    except ValueError:
        return None
    entries = found if isinstance(found, list) else [found]
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        platform = (entry.get("Descriptor") or {}).get("platform") or {}
        if isinstance(found, list) and (platform.get("os"), platform.get("architecture")) != ("linux", arch):
            continue
        manifest = entry.get("SchemaV2Manifest") or entry.get("OCIManifest")
        return _layers_size(manifest)
    return None


def insecure_registry(registry: str, registry_config: dict) -> bool:
    """Whether the engine speaks plain HTTP (or unverified TLS) to `registry`:
    it is listed as not secure, or its address is in an insecure range
    (dockerd's default: 127.0.0.0/8)."""
    index = (registry_config.get("IndexConfigs") or {}).get(registry) or {}
    if index.get("Secure") is False:
        return True
    if registry.startswith("["):
        host = registry[1:].partition("]")[0]
    else:
        name, _, port = registry.rpartition(":")
        host = name if name and port.isdigit() else registry
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    for cidr in registry_config.get("InsecureRegistryCIDRs") or []:
        try:
            if address in ipaddress.ip_network(str(cidr), strict=False):
                return True
        except ValueError:
            continue
    return False


def proxy_environment(info: dict, guard: str | None = None) -> dict[str, str]:
    """The proxies for the CLI's request: the agent's pull guard (`guard`,
    http://HOST:PORT) when it runs, else the engine's own (the Engine API's
    /info spells them HttpProxy, HttpsProxy, NoProxy), so that the registry is
    asked the way the engine's pull asks it, through the guard."""
    names = {"HttpProxy": "HTTP_PROXY", "HttpsProxy": "HTTPS_PROXY", "NoProxy": "NO_PROXY"}
    found = {env: str(info[key]) for key, env in names.items() if info.get(key)}
    if guard:
        found |= {"HTTP_PROXY": guard, "HTTPS_PROXY": guard}
    return found


class ManifestSizes:
    def __init__(
        self,
        engine: DockerEngine,
        docker_config_dir: Path,
        *,
        timeout: float = INSPECT_SECONDS,
        docker_cli: str | None = None,
        guard: str | None = None,
    ):
        """`timeout`: at most INSPECT_SECONDS, less where a pull's stall bound is shorter;
        `guard`: the pull guard's http://HOST:PORT, which the CLI's requests go through."""
        self.engine, self.docker_config_dir, self.timeout = engine, docker_config_dir, min(timeout, INSPECT_SECONDS)
        self.guard = guard
        self.docker_cli = docker_cli or shutil.which("docker") or "docker"
        self._checks = asyncio.Semaphore(CONCURRENT_CHECKS)

    async def size(self, reference: str, registry: str | None) -> int | None:
        """The image's compressed size, or None when it cannot be told now."""
        async with self._checks:
            return await self._size(reference, registry)

    async def _size(self, reference: str, registry: str | None) -> int | None:
        try:
            info = await self.engine.info()
        except EngineError:
            return None
        insecure = registry is not None and insecure_registry(registry, info.get("RegistryConfig") or {})
        args = [
            self.docker_cli,
            "manifest",
            "inspect",
            "--verbose",
            *(["--insecure"] if insecure else []),
            "--",
            reference,
        ]
        env = {**host_environment(self.docker_config_dir), **proxy_environment(info, self.guard)}
        try:
            process = await asyncio.create_subprocess_exec(
                *DIE_WITH_AGENT,
                *args,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            log.info("image_size_unknown", image=reference, error=str(exc))
            return None
        assert process.stdout is not None and process.stderr is not None
        # The bound kills the CLI, whose pipes then close: the readers end, never left paused on a full pipe.
        timed_out: list[bool] = []

        def bound() -> None:
            timed_out.append(True)
            _kill_quietly(process)

        timer = asyncio.get_running_loop().call_later(self.timeout, bound)
        try:
            printed, errors, _ = await asyncio.wait_for(
                asyncio.gather(
                    read_capped(process.stdout, MAX_OUTPUT, lambda: _kill_quietly(process)),
                    read_tail(process.stderr, ERROR_TAIL),
                    process.wait(),
                ),
                self.timeout + 5,  # a last resort: something else holding the CLI's pipes open
            )
        except asyncio.TimeoutError:
            timed_out.append(True)
            printed, errors = b"", b""
        finally:
            timer.cancel()
            await kill(process)
        if timed_out:
            log.info("image_size_unknown", image=reference, error=f"no answer within {self.timeout:g} s")
            return None
        if printed is None:
            log.info("image_size_unknown", image=reference, error=f"the manifest printed more than {MAX_OUTPUT} bytes")
            return None
        size = manifest_size(printed.decode(errors="replace")) if process.returncode == 0 else None
        if size is None:
            log.info("image_size_unknown", image=reference, error=errors.decode(errors="replace").strip()[-200:])
        return size
