"""Which way GPUs reach a renter's containers on this machine: CDI, the NVIDIA
runtime hook, or none. The sandbox writes each GPU service's
request for that way (core/sandbox/harden.py), so it must be the way the
engine will honour.

- **cdi**: dockerd's CDI feature is on (Docker 26's /info lists CDISpecDirs
  only then; Docker 28 has it on by default) and a spec in one of those
  folders, of kind `nvidia.com/gpu`, names GPUs by UUID
  (`nvidia.com/gpu=GPU-…`, what `nvidia-ctk cdi generate` writes with the
  `uuid` name strategy, and NVIDIA's generated spec by default since toolkit
  1.18). The request is `driver: cdi` with those names: dockerd itself applies
  the spec's edits, no hook reads the container's environment.
- **runtime-hook**: `nvidia-container-runtime-hook` is where dockerd finds
  it (dockerd registers its `nvidia` device driver when the hook is on its
  PATH) or an `nvidia` runtime is registered: the request is `driver:
  nvidia` with the UUIDs, as the whole suite runs it.
- **none**: neither; a GPU request then fails at the engine, and doctor's
  gpu-containers check says what to install.

When a host has both, CDI wins: dockerd's CDI feature is off by default on
Docker 26 and 27, so a host where it is on and a spec names its GPUs was set
up for it on purpose (and on Docker 28, where it is on by default, the spec
exists only if the toolkit wrote one: NVIDIA's way forward). Both give the
same GPUs: the agent still sets NVIDIA_VISIBLE_DEVICES to the rental's UUIDs
(void without GPUs), so a hook that also runs sees no other GPU. A spec that
names GPUs by index only is not used: an index is not the ledger's name for a
GPU, and the detail says how to write UUID names (docs/hosts.md).

The spec files are read bounded (a few files, each a few MiB at most): they
are root's files, but a probe must not stall or swell on a stray one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

CDI = "cdi"
RUNTIME_HOOK = "runtime-hook"
NONE = "none"
GPU_KIND = "nvidia.com/gpu"
DEFAULT_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")  # where dockerd reads specs unless told otherwise
SPEC_SUFFIXES = (".yaml", ".yml", ".json")
MAX_SPEC_FILES = 16  # with MAX_SPEC_BYTES: at most 64 MiB read in one probe, whatever lies there
MAX_SPEC_BYTES = 4 << 20
UUID_PREFIXES = ("GPU-", "MIG-")
REGENERATE = "nvidia-ctk cdi generate --device-name-strategy=uuid --output=/etc/cdi/nvidia.yaml"


@dataclass(frozen=True)
class CdiSpec:
    """One spec file as the probe read it: its kind and device names, or why it could not be read."""

    path: str
    kind: str = ""
    names: tuple[str, ...] = ()
    error: str = ""


@dataclass(frozen=True)
class DeliveryFacts:
    """What the decision needs: dockerd's CDI folders (empty: the feature is
    off), the specs found there, and the runtime hook's signs."""

    cdi_spec_dirs: tuple[str, ...] = ()
    specs: tuple[CdiSpec, ...] = ()
    hook: str = ""  # where nvidia-container-runtime-hook is, or ""
    runtimes: tuple[str, ...] = field(default_factory=tuple)


def read_specs(directories: tuple[str, ...]) -> tuple[CdiSpec, ...]:
    """The CDI spec files in dockerd's folders (blocking reads: call in a thread)."""
    found: list[CdiSpec] = []
    for directory in directories:
        try:
            # Regular files only: a FIFO of a spec's name would hold the probe forever.
            paths = sorted(p for p in Path(directory).iterdir() if p.suffix in SPEC_SUFFIXES and p.is_file())
        except OSError:
            continue
        for path in paths:
            if len(found) >= MAX_SPEC_FILES:
                return tuple(found)
            found.append(_read_spec(path))
    return tuple(found)


def _read_spec(path: Path) -> CdiSpec:
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_SPEC_BYTES + 1)
    except OSError as exc:
        return CdiSpec(str(path), error=exc.strerror or str(exc))
    if len(raw) > MAX_SPEC_BYTES:
        return CdiSpec(str(path), error=f"larger than {MAX_SPEC_BYTES >> 20} MiB, not read")
    try:
        spec = json.loads(raw) if path.suffix == ".json" else yaml.load(raw, Loader=yaml.CSafeLoader)
    except (ValueError, yaml.YAMLError) as exc:
        return CdiSpec(str(path), error=f"not a CDI spec: {str(exc).splitlines()[0][:200]}")
    if not isinstance(spec, dict):
        return CdiSpec(str(path), error="not a CDI spec")
    devices = spec.get("devices")
    devices = devices if isinstance(devices, list) else []
    names = tuple(str(d["name"]) for d in devices if isinstance(d, dict) and d.get("name") is not None)
    return CdiSpec(str(path), kind=str(spec.get("kind") or ""), names=names)


def decide(facts: DeliveryFacts) -> dict:
    """{"method": "cdi" | "runtime-hook" | "none", "detail": why}. Pure."""
    cdi, why_not_cdi = _cdi(facts)
    hook = _hook(facts)
    if cdi:
        also = f"; {hook} too, not used: CDI wins" if hook else ""
        return {"method": CDI, "detail": cdi + also}
    if hook:
        return {"method": RUNTIME_HOOK, "detail": f"{hook} (CDI: {why_not_cdi})"}
    return {"method": NONE, "detail": f"no nvidia-container-runtime-hook or nvidia runtime; CDI: {why_not_cdi}"}


def _cdi(facts: DeliveryFacts) -> tuple[str, str]:
    """(how CDI gives GPUs, "") or ("", why it does not)."""
    if not facts.cdi_spec_dirs:
        return "", 'dockerd\'s CDI feature is off ("features": {"cdi": true} in daemon.json turns it on)'
    gpu_specs = [spec for spec in facts.specs if spec.kind == GPU_KIND]
    for spec in gpu_specs:
        uuids = [name for name in spec.names if name.startswith(UUID_PREFIXES)]
        if uuids:
            return f"dockerd's CDI feature on; {spec.path} names {len(uuids)} GPU(s) by UUID ({GPU_KIND}=GPU-…)", ""
    where = ", ".join(facts.cdi_spec_dirs)
    if gpu_specs:
        return "", f"{', '.join(s.path for s in gpu_specs)} names GPUs by index only: write UUID names ({REGENERATE})"
    unreadable = [f"{spec.path}: {spec.error}" for spec in facts.specs if spec.error]
    said = f" ({'; '.join(unreadable)})" if unreadable else ""
    return "", f"no spec of kind {GPU_KIND} in {where}{said}: {REGENERATE}"


def _hook(facts: DeliveryFacts) -> str:
    signs = []
    if facts.hook:
        signs.append(f"nvidia-container-runtime-hook at {facts.hook}")
    if "nvidia" in facts.runtimes:
        signs.append("nvidia runtime registered")
    return ", ".join(signs)
