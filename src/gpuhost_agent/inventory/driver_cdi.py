"""The agent's own CDI spec of the host's GPUs, kept where dockerd reads
specs: written when no spec there names the GPUs by
UUID (a spec of the toolkit's own that does is used as it is, and the
agent's is then removed), and again when the driver's version or the GPUs
change. The driver's files are found as the driver installs them
(inventory/cdi_spec.py says which); `root` moves every path under a test's
folder. Blocking: run in a thread.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from pathlib import Path

import yaml

from gpuhost_agent.inventory import cdi_spec, gpu_delivery
from gpuhost_agent.inventory.cdi_spec import DriverFiles, Mount

# Where the driver's installers put its libraries (Debian and Ubuntu's multiarch folder first) and tools;
# /usr/local/nvidia is the layout of hosts whose driver is installed beside the system's (GKE's, and the
# GPU test machine's: docs/hardware/facts-NVIDIA-H200.txt).
LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib64",
    "/usr/local/nvidia/lib64",
)
BINARY_DIRS = ("/usr/bin", "/usr/local/bin", "/usr/local/nvidia/bin")
# Folders a container's loader and shell do not search by themselves: their files are mounted into
# ones they do (the C library's multiarch folder, /usr/bin), since the spec sets no LD_LIBRARY_PATH
# or PATH of its own over the image's.
ELSEWHERE = {"/usr/local/nvidia/lib64": f"/usr/lib/{os.uname().machine}-linux-gnu", "/usr/local/nvidia/bin": "/usr/bin"}
PREFERRED_DIR = "/etc/cdi"  # where the agent writes, when dockerd reads it (the unit may write there)
_GPU_NODE = re.compile(r"nvidia(\d+)")


def find_driver_files(root: Path, version: str) -> DriverFiles:
    """The driver's device nodes, libraries of `version` and tools under `root`."""
    dev = root / "dev"
    nodes: dict[int, Mount] = {}
    try:
        names = sorted(entry.name for entry in dev.iterdir())
    except OSError:
        names = []
    for name in names:
        found = _GPU_NODE.fullmatch(name)
        if found and _is_char_device(dev / name):
            nodes[int(found.group(1))] = Mount(str(dev / name), f"/dev/{name}")
    shared = tuple(
        Mount(str(dev / name), f"/dev/{name}") for name in cdi_spec.SHARED_NODES if _is_char_device(dev / name)
    )
    libraries: list[Mount] = []
    for folder in LIBRARY_DIRS:
        for name in cdi_spec.LIBRARIES:
            real = root / folder.lstrip("/") / f"{name}.so.{version}"
            if not real.is_file() or any(mount.container.endswith(f"/{real.name}") for mount in libraries):
                continue
            inside = ELSEWHERE.get(folder, folder)
            libraries.append(Mount(str(real), f"{inside}/{real.name}"))
            soname = real.with_name(f"{name}.so.1")
            if soname.is_symlink() and soname.resolve() == real.resolve():  # the loader's name for it
                libraries.append(Mount(str(real), f"{inside}/{soname.name}"))
    binaries = []
    for name in cdi_spec.BINARIES:
        for folder in BINARY_DIRS:
            path = root / folder.lstrip("/") / name
            if path.is_file():
                binaries.append(Mount(str(path), f"{ELSEWHERE.get(folder, folder)}/{name}"))
                break
    return DriverFiles(version, nodes, shared, tuple(libraries), tuple(binaries))


def _is_char_device(path: Path) -> bool:
    """The node itself, never through a link: dockerd's CDI library reads the path without following it."""
    try:
        return stat.S_ISCHR(path.lstat().st_mode)
    except OSError:
        return False


def keep(nvml: dict, docker: dict, root: Path = Path("/"), driver_root: Path | None = None) -> dict:
    """The agent's spec made true for this host now: {"path": where it is, or
    None; "detail": what was done or why not}. The running agent's.
    `driver_root`: where the driver's files are (GPUHOST_DRIVER_ROOT), `root` by default."""
    ours, text, detail = _plan(nvml, docker, root, driver_root or root)
    if ours is None:
        return {"path": None, "detail": detail}
    for folder in docker.get("cdiSpecDirs") or ():  # a copy of ours in another of dockerd's folders
        copy = root / str(folder).lstrip("/") / cdi_spec.SPEC_FILE
        if copy.is_file() and copy.resolve() != ours.resolve():
            _remove(copy)
    if text is None:
        _remove(ours)
        return {"path": None, "detail": detail}
    try:
        if not ours.is_file() or ours.read_text() != text:
            _write(ours, text)
            return {"path": str(ours), "detail": f"written {detail}"}
    except OSError as exc:
        return {"path": None, "detail": f"cannot write {ours}: {exc.strerror or exc}"}
    return {"path": str(ours), "detail": f"in place {detail}"}


def look(nvml: dict, docker: dict, root: Path = Path("/"), driver_root: Path | None = None) -> dict:
    """What `keep` would do, written nowhere: `probe` and `doctor` say which
    spec is in use and why without touching the running agent's files."""
    ours, text, detail = _plan(nvml, docker, root, driver_root or root)
    if ours is None or text is None:
        return {"path": None, "detail": detail}
    try:
        current = ours.read_text() if ours.is_file() else None
    except OSError as exc:
        return {"path": None, "detail": f"cannot read {ours}: {exc.strerror or exc}"}
    if current == text:
        return {"path": str(ours), "detail": f"in place {detail}"}
    how = "out of date" if current is not None else "not written yet"
    return {"path": None, "detail": f"{ours} {how}: the running agent writes it {detail}"}


def refresh(nvml: dict, root: Path = Path("/"), driver_root: Path | None = None) -> list[str]:
    """Before dockerd starts (its unit's ExecStartPre: `gpuhost-agent cdi refresh`), the agent's
    spec where one lies in a default CDI folder is made true for the GPUs NVML sees now, or removed
    where it cannot be (no driver yet, NVML failing, a piece missing). A spec left from before a
    reboot may name another GPU's node (minor numbers follow the order the driver found the GPUs
    in), and dockerd starts renters' containers again at boot, before the agent. What was done."""
    said = []
    for folder in gpu_delivery.DEFAULT_SPEC_DIRS:
        ours = root / folder.lstrip("/") / cdi_spec.SPEC_FILE
        if not ours.is_file():
            continue
        try:
            kept = keep(nvml, {"cdiSpecDirs": [folder]}, root, driver_root)
        except Exception as exc:
            kept = {"path": None, "detail": f"not made true: {exc}"}
        if kept["path"] is None:  # whatever failed (a write too), no spec is better than one that may be wrong
            _remove(ours)
        said.append(f"{ours}: {kept['detail']}" + ("" if kept["path"] else " (removed)"))
    return said


def _plan(nvml: dict, docker: dict, root: Path, driver_root: Path) -> tuple[Path | None, str | None, str]:
    """(the agent's spec file or None where dockerd reads no spec, the text it
    must hold or None where it must not be, what that means)."""
    directories = tuple(str(d) for d in docker.get("cdiSpecDirs") or ())
    if not directories:
        return None, None, "dockerd's CDI feature is off: no spec written"
    folder = PREFERRED_DIR if PREFERRED_DIR in directories else directories[0]
    ours = root / folder.lstrip("/") / cdi_spec.SPEC_FILE
    gpus = [
        (str(gpu["uuid"]), int(gpu["minorNumber"]))
        for gpu in nvml.get("gpus") or []
        if not gpu.get("error") and gpu.get("uuid") and isinstance(gpu.get("minorNumber"), int)
    ]
    # Another spec's names, never a file of the agent's own name (a copy, or ours through a linked folder).
    others = [
        spec
        for spec in gpu_delivery.read_specs(tuple(str(root / d.lstrip("/")) for d in directories))
        if Path(spec.path).name != cdi_spec.SPEC_FILE and spec.kind == cdi_spec.KIND
    ]
    named = {name for spec in others for name in spec.names}
    if gpus and all(uuid in named for uuid, _ in gpus):
        owner = next(spec.path for spec in others if set(spec.names) & {uuid for uuid, _ in gpus})
        return ours, None, f"{owner} names the GPUs by UUID: used as it is"
    # A GPU another spec names stays out of ours: two specs naming one device make it unusable.
    mine = [(uuid, minor) for uuid, minor in gpus if uuid not in named]
    version = str(nvml.get("driverVersion") or "")
    files = find_driver_files(driver_root, version)
    why = "no NVIDIA driver version" if not version else cdi_spec.problem(mine, files)
    if why:
        return ours, None, f"no spec written: {why}"
    text = yaml.safe_dump(cdi_spec.build(mine, files), sort_keys=False)
    elsewhere = f" ({len(gpus) - len(mine)} more named by another spec)" if len(mine) < len(gpus) else ""
    return ours, text, f"for {len(mine)} GPU(s), driver {version}{elsewhere}"


def _write(path: Path, text: str) -> None:
    """Whole or not at all: dockerd may read the folder at any moment."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            os.fchmod(out.fileno(), 0o644)
            out.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
