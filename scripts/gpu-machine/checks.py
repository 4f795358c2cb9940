"""The checks scripts/gpu-machine/run.sh makes once its Docker Engine and the
agent (with its local marketplace) run: what a renter does, through the
marketplace's public API, and what the kernel then holds, written as one
markdown summary.

- the README's stack deploys, serves "hello from a rental" on its published
  port and through its tunnel (the agent's own connection);
- a one-GPU rental's stack gets the machine's real GPU by the CDI spec the
  agent wrote from the driver, no runtime hook: through
  the renter's terminal (the marketplace's WebSocket, as a renter's browser),
  `nvidia-smi -L` in the container names the rental's GPU alone, and a CUDA
  driver-API program (cuda-check.c) sees it by its UUID, allocates and copies
  there and back; while it holds its memory the heartbeat's telemetry shows
  it on that GPU; a second rental asking for the machine's GPU is refused;
  once the rental ended no process holds the GPU, and the environment's
  usage counts the rental's time on it;
- the disk share, where run.sh could mount dockerd's data root on XFS with
  project quotas: the agent's probe says the size holds, and a container
  writing past its rental's share gets "No space left on device";
- each rental's containers sit in the rental's own cgroup, whose memory,
  process and CPU limits the kernel holds (cgroup v2: memory.max, pids.max,
  cpu.max; v1: the same three in their controllers' trees).

Run by the agent's own virtual environment (docker-py, aiohttp for the
terminal). Exit status 1 when a check failed. With --stand-in (the test here:
a stand-in NVML and driver) the checks that only real hardware can answer
(the memory NVML sees, the GPU's processes) are skipped, saying so.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import docker  # type: ignore[import-untyped]

IMAGE = "gpuhost-test/busybox:1"
CUDA_IMAGE = "gpuhost-test/cuda-check:1"  # busybox, cuda-check and the C library: nothing of CUDA
CUDA_MIB = 256
GREETING = "hello from a rental"
README_STACK = (
    "services:\n  web:\n    image: gpuhost-test/busybox:1\n"
    '    command: ["sh", "-c", "trap exit TERM; mkdir -p /www && echo $$GREETING > /www/index.html; '
    'echo serving on port 8080; httpd -f -v -p 8080 -h /www & wait"]\n'
    "    environment:\n      GREETING: ${GREETING}\n"
    '    ports: ["127.0.0.1::8080"]\n'
)
DISK_STACK = f"services:\n  disk:\n    image: {IMAGE}\n    command: ['sleep', '3600']\n"
GPU_STACK = (
    f"services:\n  infer:\n    image: {CUDA_IMAGE}\n    command: ['sleep', '3600']\n"
    "    deploy:\n      resources:\n        reservations:\n"
    "          devices: [{driver: nvidia, count: 1, capabilities: [gpu]}]\n"
)
CDI_NOTE = (
    "No NVIDIA Container Toolkit and no runtime hook: dockerd's CDI feature is on and the agent wrote "
    "the CDI spec itself from the driver (inventory/driver_cdi.py): the GPU's device node, the shared "
    "nodes, the driver's libraries of its version and nvidia-smi, mounted read-only. The GPU checks run "
    "in the rental's container through the renter's terminal, as a renter would."
)
SYSFS = Path("/sys/fs/cgroup")


@dataclass
class Check:
    name: str
    verdict: str  # PASS, FAIL, SKIP or INFO
    evidence: list[str] = field(default_factory=list)


class Renter:
    """The marketplace's renter API, as the README's curl lines use it."""

    def __init__(self, base: str, key: str):
        self.base, self.key = base.rstrip("/"), key

    def call(self, method: str, path: str, body: object = None) -> object:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("X-API-Key", self.key)
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read().decode()
        return json.loads(text) if text else None

    def environment(self, env_id: str) -> dict:
        found = self.call("GET", f"/environments/{env_id}")
        assert isinstance(found, dict), found
        return found

    def engine_probe(self, env_id: str) -> dict:
        """What the agent's last probe said of the Docker Engine (systemData.host.docker)."""
        return ((self.environment(env_id).get("systemData") or {}).get("host") or {}).get("docker") or {}

    def rental(self, env_id: str, name: str, gpus: int) -> str:
        body = self.call("POST", "/rentals", {"envId": env_id, "name": name, "gpuCount": gpus})
        assert isinstance(body, dict), body
        return str(body["rentalId"])

    def stack(self, rental: str, content: str, variables: dict[str, str]) -> str:
        template = {"name": "check", "description": "gpu-machine check", "content": content,
                    "environmentVariables": variables}  # fmt: skip
        return str(self.call("POST", f"/rentals/{rental}/stacks", {"template": template}))

    def stack_info(self, rental: str, stack: str) -> dict | None:
        stacks = self.call("GET", f"/rentals/{rental}/stacks")
        assert isinstance(stacks, list), stacks
        return next((s for s in stacks if s["stackId"] == stack), None)

    def settled(self, rental: str, stack: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        info = None
        while time.monotonic() < deadline:
            info = self.stack_info(rental, stack)
            if info is not None and info["status"] not in ("APPLYING",):
                return info
            time.sleep(0.5)
        return info or {"status": "missing", "errorMsg": f"not settled in {timeout:.0f} s"}


def run(*command: str) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"({command[0]}: {error})"
    return (done.stdout + done.stderr).strip()


def fetch(url: str, timeout: float) -> str:
    """The body once the URL answers 200 (a tunnel answers 503 while its service starts)."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.read().decode(errors="replace").strip()
        except (urllib.error.URLError, OSError) as error:
            last = str(error)
        time.sleep(0.5)
    return f"(no answer in {timeout:.0f} s: {last})"


def cgroup_dirs(pid: int) -> dict[str, Path]:
    """The container's own cgroup folder for memory, pids and cpu (v2: one folder)."""
    dirs: dict[str, Path] = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "" and (SYSFS / "cgroup.controllers").exists():
            return {c: SYSFS / path.lstrip("/") for c in ("memory", "pids", "cpu")}
        for controller in controllers.split(","):
            if controller in ("memory", "pids", "cpu"):
                dirs[controller] = SYSFS / controller / path.lstrip("/")
    return dirs


LIMIT_FILES = {  # v2 file, v1 file(s), per controller
    "memory": ("memory.max", ("memory.limit_in_bytes",)),
    "pids": ("pids.max", ("pids.max",)),
    "cpu": ("cpu.max", ("cpu.cfs_quota_us", "cpu.cfs_period_us")),
}


def limits(dirs: dict[str, Path], parent: bool) -> dict[str, str]:
    found: dict[str, str] = {}
    for controller, (v2, v1) in LIMIT_FILES.items():
        folder = dirs.get(controller)
        if folder is None:
            continue
        folder = folder.parent if parent else folder
        v2_file = folder / v2
        names = [v2] if v2_file.exists() and (SYSFS / "cgroup.controllers").exists() else list(v1)
        for name in names:
            try:
                found[name] = (folder / name).read_text().strip()
            except OSError as error:
                found[name] = f"({error.strerror})"
    return found


def unlimited(value: str) -> bool:
    return value.startswith(("max", "-1", "(")) or value == "9223372036854771712"


def cgroup_check(client: docker.DockerClient, rental: str, what: str) -> Check:
    check = Check(f"{what}: the rental's cgroup limits (container and parent)", "FAIL")
    containers = client.containers.list(filters={"label": f"io.gpuhost.rental-id={rental}"})
    if not containers:
        check.evidence.append(f"no container labelled io.gpuhost.rental-id={rental}")
        return check
    container = containers[0]
    pid = int(container.attrs["State"]["Pid"])
    dirs = cgroup_dirs(pid)
    memory_dir = dirs.get("memory")
    check.evidence.append(f"CgroupParent: {container.attrs['HostConfig'].get('CgroupParent')!r}")
    check.evidence.append(f"container pid {pid}, cgroup {memory_dir}")
    own, parent = limits(dirs, parent=False), limits(dirs, parent=True)
    check.evidence.append("container: " + ", ".join(f"{k}={v}" for k, v in own.items()))
    check.evidence.append(
        f"parent {memory_dir.parent if memory_dir else '?'}: " + ", ".join(f"{k}={v}" for k, v in parent.items())
    )
    in_rental = memory_dir is not None and memory_dir.parent.name == f"r-{rental}"
    memory = parent.get("memory.max", parent.get("memory.limit_in_bytes", "max"))
    pids = parent.get("pids.max", "max")
    ok = in_rental and not unlimited(memory) and not unlimited(pids)
    check.verdict = "PASS" if ok else "FAIL"
    if not in_rental:
        check.evidence.append(f"the container's cgroup is not inside r-{rental}")
    return check


def docker_facts(client: docker.DockerClient) -> list[str]:
    info = client.info()
    version = client.version()
    backing = dict(info.get("DriverStatus") or []).get("Backing Filesystem", "?")
    return [
        f"Docker Engine {info.get('ServerVersion')} (API {version.get('ApiVersion')}), "
        f"containerd {(info.get('ContainerdCommit') or {}).get('ID', '?')}, "
        f"runc {(info.get('RuncCommit') or {}).get('ID', '?')}",
        f"cgroup driver {info.get('CgroupDriver')}, cgroup version {info.get('CgroupVersion')}",
        f"storage {info.get('Driver')} on {backing}, data root {info.get('DockerRootDir')}",
        f"runtimes {sorted(info.get('Runtimes') or {})}, default {info.get('DefaultRuntime')}",
        f"kernel {info.get('KernelVersion')}, {info.get('OperatingSystem')}, {info.get('NCPU')} CPUs, "
        f"{int(info.get('MemTotal', 0)) / 2**30:.1f} GiB",
        f"security options {info.get('SecurityOptions')}",
        f"warnings {info.get('Warnings')}",
    ]


def readme_checks(renter: Renter, env_id: str, client: docker.DockerClient) -> tuple[list[Check], str]:
    rental = renter.rental(env_id, "readme", 0)
    stack = renter.stack(rental, README_STACK, {"GREETING": GREETING})
    info = renter.settled(rental, stack, timeout=90)
    deployed = Check("README stack deploys", "PASS" if info["status"] == "APPLIED" else "FAIL")
    deployed.evidence.append(f"rental {rental}, stack {stack}: {info['status']} {info.get('errorMsg') or ''}".strip())
    checks = [deployed]
    if info["status"] != "APPLIED":
        return checks, rental
    port_check = Check("README stack: its published port serves it", "FAIL")
    deadline = time.monotonic() + 30
    port = None
    while port is None and time.monotonic() < deadline:
        listed = renter.call("GET", f"/rentals/{rental}/stacks/{stack}/containers")
        published = [p for c in listed or [] for p in c.get("Ports", []) if "PublicPort" in p]  # type: ignore[union-attr]
        port = published[0]["PublicPort"] if published else None
        if port is None:
            time.sleep(0.5)
    body = fetch(f"http://127.0.0.1:{port}/", 30) if port else "(no published port listed)"
    port_check.verdict = "PASS" if body == GREETING else "FAIL"
    port_check.evidence.append(f"curl http://127.0.0.1:{port}/ -> {body!r}")
    tunnel_check = Check("README stack: served through its tunnel", "FAIL")
    url = None
    while url is None and time.monotonic() < deadline + 30:
        tunnels = (renter.stack_info(rental, stack) or {}).get("tunnels") or []
        url = next((t["url"] for t in tunnels if str(t.get("url", "")).startswith("http")), None)
        if url is None:
            time.sleep(0.5)
    body = fetch(url, 30) if url else "(no http tunnel listed)"
    tunnel_check.verdict = "PASS" if body == GREETING else "FAIL"
    tunnel_check.evidence.append(f"curl {url} -> {body!r}")
    checks += [port_check, tunnel_check, cgroup_check(client, rental, "README stack")]
    return checks, rental


def gpu_checks(
    renter: Renter, env_id: str, client: docker.DockerClient, uuid: str, source: str, stand_in: bool, hold: int
) -> tuple[list[Check], str | None]:
    name = "one-GPU stack gets the GPU by the agent's CDI spec"
    if not uuid:
        return [Check(name, "SKIP", ["no GPU here: `nvidia-smi -L` names none"])], None
    check = Check(name, "FAIL", [f"{source}: {uuid}"])
    delivery = wait_for_cdi(renter, env_id, timeout=60)
    check.evidence.append(f"the agent's probe: GPU delivery {delivery}")
    rental = renter.rental(env_id, "one-gpu", 1)
    stack = renter.stack(rental, GPU_STACK, {})
    info = renter.settled(rental, stack, timeout=90)
    check.evidence.append(f"rental {rental} (gpuCount 1), stack {stack}: {info['status']} {info.get('errorMsg') or ''}")
    if info["status"] != "APPLIED":
        return [check], rental
    [container] = client.containers.list(filters={"label": f"io.gpuhost.rental-id={rental}"})
    requests = container.attrs["HostConfig"].get("DeviceRequests")
    check.evidence.append(f"HostConfig.DeviceRequests: {json.dumps(requests)}")
    wanted = [{"Driver": "cdi", "DeviceIDs": [f"nvidia.com/gpu={uuid}"]}]
    asked = [{"Driver": r.get("Driver"), "DeviceIDs": r.get("DeviceIDs")} for r in requests or []]
    check.verdict = "PASS" if asked == wanted else "FAIL"
    checks = [check, cgroup_check(client, rental, "one-GPU stack")]
    checks += asyncio.run(gpu_in_container(renter, env_id, rental, stack, container.id, uuid, stand_in, hold))
    checks.append(second_rental_refused(renter, env_id))
    return checks, rental


def wait_for_cdi(renter: Renter, env_id: str, timeout: float) -> str:
    """The agent's probe once it says CDI (its spec written at its first probe), or what it said last."""
    deadline = time.monotonic() + timeout
    said = "(no system data yet)"
    while time.monotonic() < deadline:
        engine = renter.engine_probe(env_id)
        delivery, spec = engine.get("gpuDelivery") or {}, engine.get("cdiSpec") or {}
        said = f"{delivery.get('method')}: {delivery.get('detail')}; the agent's spec: {spec.get('detail')}"
        if delivery.get("method") == "cdi":
            return said
        time.sleep(0.5)
    return said


async def gpu_in_container(
    renter: Renter, env_id: str, rental: str, stack: str, container: str, uuid: str, stand_in: bool, hold: int
) -> list[Check]:
    """What the renter's terminal shows in the rental's container: nvidia-smi, then the CUDA program
    holding its memory while the heartbeat's telemetry is read."""
    listed = Check("the container sees exactly its GPU (nvidia-smi -L)", "FAIL")
    said = await in_terminal(renter, rental, stack, container, "nvidia-smi -L", timeout=60)
    named = [line.strip() for line in said.splitlines() if line.strip().startswith("GPU ")]
    listed.verdict = "PASS" if len(named) == 1 and f"(UUID: {uuid})" in named[0] else "FAIL"
    listed.evidence.append(f"nvidia-smi -L in the container: {' / '.join(named) or said.strip()[-300:]}")
    program = Check("a CUDA program passes in the rental's container", "FAIL")
    telemetry = Check("the heartbeat's telemetry shows the memory it took on that GPU", "FAIL")
    before = await asyncio.to_thread(gpu_memory, renter, env_id, uuid, None)
    watcher: list[asyncio.Task] = []

    def on_output(text: str) -> None:
        if "cuda-check: holding" in text and not watcher:
            since = datetime.datetime.now(datetime.timezone.utc)
            watcher.append(asyncio.create_task(asyncio.to_thread(gpu_memory, renter, env_id, uuid, since, hold)))

    said = await in_terminal(
        renter, rental, stack, container, f"cuda-check {CUDA_MIB} {hold}", timeout=hold + 120, on_output=on_output
    )
    lines = [line.strip() for line in said.splitlines() if line.strip().startswith("cuda-check: ")]
    devices = [line.split()[3] for line in lines if line.startswith("cuda-check: device ")]
    program.verdict = "PASS" if lines[-1:] == ["cuda-check: PASS"] and devices == [uuid] else "FAIL"
    program.evidence += lines
    during = await watcher[0] if watcher else None
    if stand_in:
        telemetry.verdict = "SKIP"
        telemetry.evidence.append("a stand-in NVML: its memory figures do not move")
    elif before is None or during is None:
        telemetry.evidence.append(f"no heartbeat figure for {uuid} (before {before}, during {during})")
    else:
        telemetry.verdict = "PASS" if during - before >= CUDA_MIB << 20 else "FAIL"
    telemetry.evidence.append(f"memoryUsedBytes of {uuid}: {before} before, {during} while it held {CUDA_MIB} MiB")
    return [listed, program, telemetry]


async def in_terminal(
    renter: Renter, rental: str, stack: str, container: str, command: str, timeout: float, on_output=None
) -> str:
    """`command`'s output in the container, through the renter's terminal: the marketplace's terminal
    instance and its WebSocket (TTY output), until the shell says the command ended."""
    path = f"/rentals/{rental}/stacks/{stack}/containers/{container}/terminal"
    created = await asyncio.to_thread(renter.call, "POST", path, {"cols": 200, "rows": 50})
    assert isinstance(created, dict) and "url" in created, created
    seen = ""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with aiohttp.ClientSession() as http, http.ws_connect(created["url"]) as ws:
        # The quotes keep the terminal's echo of the line from reading as the command's end.
        await ws.send_bytes(f'{command}; echo "gpuhost-"end=$?\n'.encode())
        while "gpuhost-end=" not in seen:
            message = await ws.receive(timeout=max(0.1, deadline - loop.time()))
            if message.type != aiohttp.WSMsgType.BINARY:
                seen += f"\n(terminal: {message.type.name} {message.data})\n"
                break
            seen += message.data.decode(errors="replace")
            if on_output is not None:
                on_output(seen)
        await ws.send_bytes(b"exit\n")
    return seen.replace("\r", "")


def gpu_memory(
    renter: Renter, env_id: str, uuid: str, since: datetime.datetime | None, timeout: float = 0
) -> int | None:
    """The GPU's memoryUsedBytes in the heartbeat: the last one, or the first beat after `since`."""
    deadline = time.monotonic() + timeout
    while True:
        beat = renter.environment(env_id).get("heartbeat") or {}
        at = beat.get("lastBeatAt")
        fresh = since is None or (at and datetime.datetime.fromisoformat(at.replace("Z", "+00:00")) > since)
        figures = [g for g in beat.get("gpus") or [] if isinstance(g, dict) and g.get("uuid") == uuid]
        if fresh and figures:
            return figures[0].get("memoryUsedBytes")
        if time.monotonic() > deadline:
            return None
        time.sleep(1)


def disk_checks(
    renter: Renter, env_id: str, client: docker.DockerClient, xfs: str, share: str
) -> tuple[list[Check], str | None]:
    """A rental's disk share held by the kernel (overlay2 on XFS with prjquota), where run.sh mounted it."""
    name = "a container writing past its rental's disk share gets ENOSPC"
    if not xfs.startswith("mounted"):
        return [Check(name, "SKIP", [f"XFS with project quotas: {xfs}"])], None
    check = Check(name, "FAIL", [f"XFS with project quotas: {xfs}"])
    quota = renter.engine_probe(env_id).get("storageQuota") or {}
    check.evidence.append(f"the agent's probe: storageQuota {quota}")
    rental = renter.rental(env_id, "disk", 0)
    stack = renter.stack(rental, DISK_STACK, {})
    info = renter.settled(rental, stack, timeout=90)
    check.evidence.append(f"rental {rental}, stack {stack}: {info['status']} {info.get('errorMsg') or ''}")
    if info["status"] != "APPLIED" or not quota.get("available"):
        return [check], rental
    [container] = client.containers.list(filters={"label": f"io.gpuhost.rental-id={rental}"})
    check.evidence.append(f"HostConfig.StorageOpt: {container.attrs['HostConfig'].get('StorageOpt')}")
    written = asyncio.run(
        in_terminal(renter, rental, stack, container.id, "dd if=/dev/zero of=/fill bs=1M count=1024; ls -l /fill", 120)
    )
    said = [line.strip() for line in written.splitlines() if "dd:" in line or "/fill" in line or "records" in line]
    check.evidence += said[-4:]
    check.verdict = "PASS" if "No space left on device" in written else "FAIL"
    check.evidence.append(f"the rental's share: {share}")
    return [check], rental


def second_rental_refused(renter: Renter, env_id: str) -> Check:
    """The machine's GPU is the first rental's: the marketplace refuses another one GPU."""
    check = Check("a second rental asking for the machine's GPU is refused", "FAIL")
    try:
        rental = renter.rental(env_id, "second", 1)
    except urllib.error.HTTPError as error:
        check.verdict = "PASS" if error.code == 409 else "FAIL"
        check.evidence.append(f"POST /rentals gpuCount 1: {error.code} {error.read().decode(errors='replace')[:200]}")
        return check
    check.evidence.append(f"POST /rentals gpuCount 1 made rental {rental}")
    renter.call("DELETE", f"/rentals/{rental}")
    return check


def usage_counted(renter: Renter, env_id: str, rental: str | None) -> Check:
    """The ended GPU rental's time on its GPU reached the marketplace's usage (the host's bill)."""
    check = Check("the rental's usage counts its time on the GPU", "FAIL")
    if rental is None:
        check.verdict = "SKIP"
        check.evidence.append("no GPU rental here")
        return check
    deadline = time.monotonic() + 30
    hours = 0.0
    while time.monotonic() < deadline:
        listed = renter.call("GET", f"/environments/{env_id}/usage")
        rows = [r for r in (listed or {}).get("total", {}).get("rentals", []) if r.get("rentalId") == rental]  # type: ignore[union-attr]
        hours = float(rows[0]["hours"]) if rows else 0.0
        if hours > 0:
            break
        time.sleep(1)
    check.verdict = "PASS" if hours > 0 else "FAIL"
    check.evidence.append(f"GET /environments/{{env}}/usage: rental {rental}: {hours * 3600:.0f} GPU-seconds")
    return check


def gpu_left_alone(renter: Renter, env_id: str, uuid: str, stand_in: bool) -> Check:
    """After the rental ended, nothing of it holds the GPU: no compute process (nvidia-smi on the host)."""
    check = Check("after the rental ended nothing holds the GPU", "FAIL")
    if stand_in or not uuid:
        check.verdict = "SKIP"
        check.evidence.append("a stand-in GPU: no process can hold it" if uuid else "no GPU here")
        return check
    apps = run("nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader", "-i", uuid)
    check.verdict = "PASS" if not apps else "FAIL"
    check.evidence.append(f"nvidia-smi --query-compute-apps on the host: {apps or '(none)'}")
    check.evidence.append(f"memoryUsedBytes in the last heartbeat: {gpu_memory(renter, env_id, uuid, None)}")
    return check


def end_rentals(renter: Renter, rentals: list[str], client: docker.DockerClient) -> Check:
    """Ended rentals take their containers and cgroups with them (the machine is left as found)."""
    check = Check("rentals ended: containers and cgroups gone", "PASS")
    for rental in rentals:
        renter.call("DELETE", f"/rentals/{rental}")
    deadline = time.monotonic() + 60
    for rental in rentals:
        while client.containers.list(all=True, filters={"label": f"io.gpuhost.rental-id={rental}"}):
            if time.monotonic() > deadline:
                check.verdict = "FAIL"
                check.evidence.append(f"rental {rental}'s containers still there after 60 s")
                break
            time.sleep(0.5)
    homes = [SYSFS, SYSFS / "memory", SYSFS / "pids", SYSFS / "cpu", SYSFS / "cpu,cpuacct"]  # v2, then v1
    # The agent removes a rental's cgroup once its stacks are down, a moment after
    # the last container went (a run that looked in between failed).
    while left := [str(p) for home in homes for r in rentals if (p := home / "gpuhost-agent" / f"r-{r}").exists()]:
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if left:
        check.verdict = "FAIL"
        check.evidence.append(f"cgroups left: {left}")
    else:
        check.evidence.append(f"{len(rentals)} rentals ended")
    return check


def summary(facts: list[str], engine: list[str], checks: list[Check], seconds: float) -> str:
    lines = ["# gpuhost-agent on the GPU test machine (scripts/gpu-machine/run.sh)", ""]
    lines += ["## Machine", "", *[f"- {fact}" for fact in facts], "", "## Docker info", ""]
    lines += [f"- {fact}" for fact in engine]
    lines += ["", "## Checks", "", "| check | verdict | evidence |", "| --- | --- | --- |"]
    for check in checks:
        evidence = "<br>".join(e.replace("|", "\\|") for e in check.evidence)
        lines.append(f"| {check.name} | {check.verdict} | {evidence} |")
    failed = sum(c.verdict == "FAIL" for c in checks)
    lines += ["", f"{len(checks)} checks, {failed} failed, in {seconds:.0f} s.", "", "## GPUs in containers", ""]
    lines += [CDI_NOTE, ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the local marketplace's base URL, ending in /v1")
    parser.add_argument("--key", required=True, help="its renter API key")
    parser.add_argument("--summary", required=True, type=Path, help="the markdown file to write")
    parser.add_argument("--gpu-uuid", default="", help="the real GPU's UUID (nvidia-smi -L); empty: no GPU")
    parser.add_argument("--gpu-uuid-source", default="nvidia-smi -L", help="where --gpu-uuid came from")
    parser.add_argument("--fact", action="append", default=[], help="a line for the Machine section")
    parser.add_argument(
        "--stand-in", action="store_true", help="a stand-in NVML and driver: skip what they cannot show"
    )
    parser.add_argument("--xfs", default="not tried", help="run.sh's XFS data root: 'mounted: ...' or why not")
    parser.add_argument("--rental-disk", default="", help="the rental's disk share run.sh gave the agent")
    parser.add_argument("--hold", type=int, default=35, help="seconds the CUDA program holds its memory (a heartbeat)")
    args = parser.parse_args()
    start = time.monotonic()
    client = docker.from_env(timeout=120)
    renter = Renter(args.base, args.key)
    environments = renter.call("GET", "/environments")
    assert isinstance(environments, list) and environments, environments
    env_id = environments[0]["envId"]
    checks, rentals = [], []
    gpu_rental: list[str | None] = [None]

    def gpus() -> tuple[list[Check], str | None]:
        found, gpu_rental[0] = gpu_checks(
            renter, env_id, client, args.gpu_uuid, args.gpu_uuid_source, args.stand_in, args.hold
        )
        return found, gpu_rental[0]

    for step in (
        lambda: readme_checks(renter, env_id, client),
        gpus,
        lambda: disk_checks(renter, env_id, client, args.xfs, args.rental_disk),
    ):
        try:
            found, rental = step()
        except Exception as error:  # a check's own failure is a FAIL in the summary, not a lost summary
            found, rental = [Check(f"check crashed: {type(error).__name__}", "FAIL", [str(error)])], None
        checks += found
        rentals += [rental] if rental else []
        for check in found:
            print(f"{check.verdict:4}  {check.name}: {' / '.join(check.evidence)}", flush=True)
    checks.append(end_rentals(renter, rentals, client))
    checks.append(gpu_left_alone(renter, env_id, args.gpu_uuid, args.stand_in))
    checks.append(usage_counted(renter, env_id, gpu_rental[0]))
    for check in checks[-3:]:
        print(f"{check.verdict:4}  {check.name}: {' / '.join(check.evidence)}", flush=True)
    text = summary(args.fact, docker_facts(client), checks, time.monotonic() - start)
    args.summary.write_text(text)
    print(f"summary: {args.summary}")
    return 1 if any(c.verdict == "FAIL" for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
