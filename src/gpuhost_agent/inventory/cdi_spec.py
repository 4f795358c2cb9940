"""A CDI spec of this host's NVIDIA GPUs, made from what the driver has.
Pure: the driver's files as found, the GPUs' UUIDs and
minor numbers in; the spec out.

One device per GPU, named by its UUID (`nvidia.com/gpu=GPU-…`, the name the
sandbox asks for: core/sandbox/harden.py), with its own device node; the
shared nodes (nvidiactl, the UVM nodes, modeset) with every device; the
driver's user-space libraries of the running version and its tools mounted
read-only where the host has them (a CUDA image's loader finds them in its
default folders, as with NVIDIA's own spec); and NVIDIA_VISIBLE_DEVICES=void,
so that a runtime hook, where one is installed too, gives nothing more. No
hooks: dockerd applies the edits itself, and nothing on the host runs with
input from the container (the toolkit's hooks are a known root escape class:
CVE-2024-0132, CVE-2025-23266).
"""

from __future__ import annotations

from dataclasses import dataclass

CDI_VERSION = "0.5.0"
KIND = "nvidia.com/gpu"
SPEC_FILE = "gpuhost-nvidia.yaml"  # the agent's own, beside any the toolkit writes
# The driver's user-space libraries a CUDA, NVML or OpenCL program loads (each `<name>.so.<driver version>`).
LIBRARIES = (
    "libcuda",
    "libcudadebugger",
    "libnvidia-ml",
    "libnvidia-ptxjitcompiler",
    "libnvidia-nvvm",
    "libnvidia-gpucomp",
    "libnvidia-allocator",
    "libnvidia-cfg",
    "libnvidia-opencl",
)
BINARIES = ("nvidia-smi", "nvidia-debugdump", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server")
SHARED_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
MOUNT_OPTIONS = ["ro", "nosuid", "nodev", "bind"]


@dataclass(frozen=True)
class Mount:
    host: str  # the file on the host
    container: str  # where the container sees it


@dataclass(frozen=True)
class DriverFiles:
    """What the driver has on this host: each GPU's node by minor number,
    the shared nodes, the libraries (soname links included, each the file it
    names) and the tools; `host` paths under the root they were found in."""

    version: str
    nodes: dict[int, Mount]
    shared: tuple[Mount, ...]
    libraries: tuple[Mount, ...]
    binaries: tuple[Mount, ...]


def problem(gpus: list[tuple[str, int]], files: DriverFiles) -> str | None:
    """Why no spec can be made of `gpus` (uuid, minor) and `files`, or None."""
    if not gpus:
        return "NVML lists no GPU"
    missing = [f"/dev/nvidia{minor} ({uuid})" for uuid, minor in gpus if minor not in files.nodes]
    if missing:
        return f"no device node {', '.join(missing[:4])}"
    if not any(mount.container.endswith("/libcuda.so.1") for mount in files.libraries):
        return f"no libcuda.so.1 of driver {files.version} in the driver's library folders"
    if not any(mount.container.endswith("/nvidiactl") for mount in files.shared):
        return "no /dev/nvidiactl"
    return None


def build(gpus: list[tuple[str, int]], files: DriverFiles) -> dict:
    """The spec: a device per GPU (by UUID), the common edits for all."""
    devices = [
        {"name": uuid, "containerEdits": {"deviceNodes": [_node(files.nodes[minor])]}} for uuid, minor in sorted(gpus)
    ]
    mounts = [
        {"hostPath": mount.host, "containerPath": mount.container, "options": list(MOUNT_OPTIONS)}
        for mount in (*files.libraries, *files.binaries)
    ]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": devices,
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [_node(node) for node in files.shared],
            "mounts": mounts,
        },
    }


def _node(mount: Mount) -> dict:
    return {"path": mount.container, "hostPath": mount.host}
