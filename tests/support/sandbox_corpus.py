"""The sandbox corpus (tests/sandbox_corpus/): hostile and legitimate Compose
files, each with a header saying what it tries or shows (see its README). The
headers are read once, at import."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from gpuhost_agent.core.sandbox.harden import GPU_LABEL, NO_EXTRA_DEVICES
from gpuhost_agent.protocol import wire

CORPUS = Path(__file__).resolve().parents[1] / "sandbox_corpus"
HOSTILE = sorted((CORPUS / "hostile").glob("*.yaml"))
LEGIT = sorted((CORPUS / "legit").glob("*.yaml"))


@functools.cache
def header(path: Path) -> dict:
    fields = {}
    for line in path.read_text().splitlines():
        match = re.match(r"#\s*([a-z-]+):\s*(.*)", line)
        if not match:
            break
        fields[match.group(1)] = match.group(2).strip()
    return fields


# Every label of the agent's namespace that it reads, set on every container whatever the image carries.
AGENT_LABELS = (*wire.AGENT_LABELS, wire.LABEL_GPUS, wire.LABEL_SSH, wire.LABEL_EXPOSED_PORTS, GPU_LABEL)

for _path in HOSTILE + LEGIT:  # read once here, not on a test's event loop
    header(_path)


def assert_container_sandboxed(attrs: dict, *, allowed_gpus: int) -> None:
    """`docker inspect` of a container the agent started: what holds whatever
    its Compose file asked (the sandbox's invariants)."""
    host = attrs["HostConfig"]
    name = attrs["Name"]
    assert host["Privileged"] is False and "no-new-privileges:true" in (host.get("SecurityOpt") or []), name
    assert host["Memory"] > 0 and host["NanoCpus"] > 0 and host["PidsLimit"] > 0, name
    assert {"MKNOD", "NET_RAW", "SYS_ADMIN"} <= {cap.removeprefix("CAP_") for cap in host["CapDrop"]}, name
    assert not host.get("CapAdd") and not host.get("Devices") and not host.get("DeviceCgroupRules"), name
    assert host.get("Runtime") in (None, "", "runc"), name
    # container:<id> is a service of the same stack (network_mode: service:web): the policy's rule
    assert host.get("NetworkMode") != "host" and host.get("PidMode") != "host", name
    assert host.get("UTSMode") in (None, ""), name
    assert host.get("IpcMode") != "host", name
    # the rental's own cgroup (this machine's dockerd uses cgroupfs), holding the rental's limits
    assert host.get("CgroupParent", "").startswith("/gpuhost-agent/r-") and host.get("UsernsMode") in (None, ""), name
    assert all(mount["Type"] in ("volume", "tmpfs") for mount in attrs.get("Mounts") or []), name
    log = host["LogConfig"]  # capped: the agent's default 50m x 3 in these tests
    assert log["Type"] in ("json-file", "local") and log["Config"] == {"max-size": "50m", "max-file": "3"}, name
    for bindings in (host.get("PortBindings") or {}).values():
        assert all(binding["HostIp"] == "127.0.0.1" for binding in bindings), name
    gpus = [
        device
        for request in host.get("DeviceRequests") or []
        for device in request.get("DeviceIDs") or []
        if request.get("Driver") == "nvidia"
    ]
    assert all(request.get("Count") in (0, None) for request in host.get("DeviceRequests") or []), name
    assert len(gpus) <= allowed_gpus, (name, gpus)
    env = dict(item.partition("=")[::2] for item in attrs["Config"].get("Env") or [])
    visible = env.get("NVIDIA_VISIBLE_DEVICES", "void")
    assert visible == "void" or set(visible.split(",")) == set(gpus), (name, visible, gpus)
    # Nothing left to the engine's default or to the image's ENV and labels.
    assert host.get("CgroupnsMode") == "private", (name, host.get("CgroupnsMode"))
    assert {key: env.get(key) for key in NO_EXTRA_DEVICES} == NO_EXTRA_DEVICES, name
    assert env.get("NVIDIA_DRIVER_CAPABILITIES"), name
    labels = attrs["Config"].get("Labels") or {}
    assert all(key in labels for key in AGENT_LABELS), (name, sorted(k for k in labels if k.startswith("io.gpuhost.")))
    assert labels[wire.LABEL_SSH] in ("", "true") and set(labels[GPU_LABEL].split(",")) - {""} == set(gpus), name
