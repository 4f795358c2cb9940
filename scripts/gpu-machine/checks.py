"""The checks scripts/gpu-machine/run.sh makes once its Docker Engine and the
agent (with its local marketplace) run: what a renter does, through the
marketplace's public API, and what the kernel then holds, written as one
markdown summary.

- the README's stack deploys, serves "hello from a rental" on its published
  port and through its tunnel (the agent's own connection);
- a one-GPU rental's stack gets the machine's real GPU: the UUID the agent
  read from NVML is what dockerd hands the container in
  NVIDIA_VISIBLE_DEVICES, and it is the one `nvidia-smi -L` names;
- each rental's containers sit in the rental's own cgroup, whose memory,
  process and CPU limits the kernel holds (cgroup v2: memory.max, pids.max,
  cpu.max; v1: the same three in their controllers' trees).

Run by the agent's own virtual environment (docker-py and nothing else beyond
the standard library). Exit status 1 when a check failed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import docker  # type: ignore[import-untyped]

IMAGE = "gpuhost-test/busybox:1"
GREETING = "hello from a rental"
README_STACK = (
    "services:\n  web:\n    image: gpuhost-test/busybox:1\n"
    '    command: ["sh", "-c", "trap exit TERM; mkdir -p /www && echo $$GREETING > /www/index.html; '
    'echo serving on port 8080; httpd -f -v -p 8080 -h /www & wait"]\n'
    "    environment:\n      GREETING: ${GREETING}\n"
    '    ports: ["127.0.0.1::8080"]\n'
)
GPU_STACK = (
    f"services:\n  infer:\n    image: {IMAGE}\n    command: ['sleep', '3600']\n"
    "    deploy:\n      resources:\n        reservations:\n"
    "          devices: [{driver: nvidia, count: 1, capabilities: [gpu]}]\n"
)
TOOLKIT_NOTE = (
    "A GPU inside a container needs the NVIDIA Container Toolkit (its OCI hook or CDI), which no "
    "registry reachable here serves. dockerd's `nvidia` device driver is registered by the project's "
    "stand-in hook (`scripts/fake-nvidia/`), which does nothing: the container is given the real GPU's "
    "UUID in NVIDIA_VISIBLE_DEVICES, as the toolkit would act on, but no /dev/nvidia* device and no "
    "driver library."
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
    renter: Renter, env_id: str, client: docker.DockerClient, uuid: str, source: str
) -> tuple[list[Check], str | None]:
    if not uuid:
        return [
            Check("one-GPU stack gets the real GPU's UUID", "SKIP", ["no GPU here: `nvidia-smi -L` names none"])
        ], None
    rental = renter.rental(env_id, "one-gpu", 1)
    stack = renter.stack(rental, GPU_STACK, {})
    info = renter.settled(rental, stack, timeout=90)
    check = Check("one-GPU stack gets the real GPU's UUID", "FAIL")
    check.evidence.append(f"rental {rental} (gpuCount 1), stack {stack}: {info['status']} {info.get('errorMsg') or ''}")
    if info["status"] != "APPLIED":
        return [check], rental
    [container] = client.containers.list(filters={"label": f"io.gpuhost.rental-id={rental}"})
    pid = int(container.attrs["State"]["Pid"])
    environ = dict(item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item)
    visible = environ.get("NVIDIA_VISIBLE_DEVICES", "(unset)")
    requests = container.attrs["HostConfig"].get("DeviceRequests")
    check.verdict = "PASS" if visible == uuid else "FAIL"
    check.evidence.append(f"{source}: {uuid}")
    check.evidence.append(f"the container's NVIDIA_VISIBLE_DEVICES: {visible}")
    check.evidence.append(f"HostConfig.DeviceRequests: {json.dumps(requests)}")
    device = Check("a GPU device inside the container", "INFO", ["needs the NVIDIA Container Toolkit (below)"])
    device.evidence.append("ls /dev/nvidia* in the container: " + run_in(container, "ls /dev/nvidia* 2>&1 || true"))
    return [check, cgroup_check(client, rental, "one-GPU stack"), device], rental


def run_in(container: object, shell: str) -> str:
    result = container.exec_run(["sh", "-c", shell])  # type: ignore[attr-defined]
    return result.output.decode(errors="replace").strip().replace("\n", " ")


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
    # the last container went (a run of 2026-11-28 looked in between and failed).
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
    lines += [TOOLKIT_NOTE, ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the local marketplace's base URL, ending in /v1")
    parser.add_argument("--key", required=True, help="its renter API key")
    parser.add_argument("--summary", required=True, type=Path, help="the markdown file to write")
    parser.add_argument("--gpu-uuid", default="", help="the real GPU's UUID (nvidia-smi -L); empty: no GPU")
    parser.add_argument("--gpu-uuid-source", default="nvidia-smi -L", help="where --gpu-uuid came from")
    parser.add_argument("--fact", action="append", default=[], help="a line for the Machine section")
    args = parser.parse_args()
    start = time.monotonic()
    client = docker.from_env(timeout=120)
    renter = Renter(args.base, args.key)
    environments = renter.call("GET", "/environments")
    assert isinstance(environments, list) and environments, environments
    env_id = environments[0]["envId"]
    checks, rentals = [], []
    for step in (
        lambda: readme_checks(renter, env_id, client),
        lambda: gpu_checks(renter, env_id, client, args.gpu_uuid, args.gpu_uuid_source),
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
    print(f"{checks[-1].verdict:4}  {checks[-1].name}: {' / '.join(checks[-1].evidence)}", flush=True)
    text = summary(args.fact, docker_facts(client), checks, time.monotonic() - start)
    args.summary.write_text(text)
    print(f"summary: {args.summary}")
    return 1 if any(c.verdict == "FAIL" for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
