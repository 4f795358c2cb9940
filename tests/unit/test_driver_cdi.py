"""The agent's own CDI spec (inventory/cdi_spec.py, inventory/driver_cdi.py)
from a stand-in driver root: device nodes made with
mknod in the test's folder (the real kernel's character devices, /dev/null's
numbers), the driver's libraries as its installer lays them out (the versioned
file and the loader's soname link) and its tools. The spec's devices, mounts
and environment are exactly the expected ones; it is rewritten when the
driver changes, left alone while nothing does, and given up for a spec of the
toolkit's own that names the GPUs by UUID."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from gpuhost_agent.inventory import cdi_spec, driver_cdi, gpu_delivery

VERSION = "550.54.15"
LIBDIR = "usr/lib/x86_64-linux-gnu"
UUIDS = ["GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111"]


def _driver_root(root: Path, version: str = VERSION, gpus: int = 2) -> None:
    (root / "dev").mkdir(exist_ok=True)
    for name in [*(f"nvidia{minor}" for minor in range(gpus)), "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]:
        node = root / "dev" / name
        if not node.exists():
            os.mknod(node, 0o666 | 0o020000, os.makedev(1, 3))  # S_IFCHR, /dev/null's numbers
    (root / "dev" / "nvidia-caps").mkdir(exist_ok=True)  # a folder of that prefix: not a GPU
    libs = root / LIBDIR
    libs.mkdir(parents=True, exist_ok=True)
    for name in ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler"):
        (libs / f"{name}.so.{version}").write_bytes(b"\x7fELF stand-in")
        link = libs / f"{name}.so.1"
        link.unlink(missing_ok=True)
        link.symlink_to(f"{name}.so.{version}")
    (libs / "libcuda.so").unlink(missing_ok=True)
    (libs / "libcuda.so").symlink_to("libcuda.so.1")  # the development link: not mounted
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    (root / "usr/bin/nvidia-smi").write_text("#!/bin/sh\n")


def _nvml(version: str = VERSION, gpus: int = 2) -> dict:
    return {
        "driverVersion": version,
        "gpus": [{"index": i, "minorNumber": i, "uuid": UUIDS[i]} for i in range(gpus)],
    }


DOCKER = {"cdiSpecDirs": ["/etc/cdi", "/var/run/cdi"]}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    _driver_root(tmp_path)
    return tmp_path


def test_the_spec_names_each_gpu_by_uuid_with_its_node_and_the_drivers_files(root: Path) -> None:
    kept = driver_cdi.keep(_nvml(), DOCKER, root)
    assert kept == {
        "path": str(root / "etc/cdi/gpuhost-nvidia.yaml"),
        "detail": f"written for 2 GPU(s), driver {VERSION}",
    }
    spec = yaml.safe_load(Path(kept["path"]).read_text())
    lib = f"{root}/{LIBDIR}"

    def mount(host: str, container: str) -> dict:
        return {"hostPath": host, "containerPath": container, "options": ["ro", "nosuid", "nodev", "bind"]}

    assert spec == {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": [
            {
                "name": UUIDS[0],
                "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0", "hostPath": f"{root}/dev/nvidia0"}]},
            },
            {
                "name": UUIDS[1],
                "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia1", "hostPath": f"{root}/dev/nvidia1"}]},
            },
        ],
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [
                {"path": f"/dev/{name}", "hostPath": f"{root}/dev/{name}"}
                for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
            ],
            "mounts": [
                mount(f"{lib}/libcuda.so.{VERSION}", f"/{LIBDIR}/libcuda.so.{VERSION}"),
                mount(f"{lib}/libcuda.so.{VERSION}", f"/{LIBDIR}/libcuda.so.1"),
                mount(f"{lib}/libnvidia-ml.so.{VERSION}", f"/{LIBDIR}/libnvidia-ml.so.{VERSION}"),
                mount(f"{lib}/libnvidia-ml.so.{VERSION}", f"/{LIBDIR}/libnvidia-ml.so.1"),
                mount(
                    f"{lib}/libnvidia-ptxjitcompiler.so.{VERSION}", f"/{LIBDIR}/libnvidia-ptxjitcompiler.so.{VERSION}"
                ),
                mount(f"{lib}/libnvidia-ptxjitcompiler.so.{VERSION}", f"/{LIBDIR}/libnvidia-ptxjitcompiler.so.1"),
                mount(f"{root}/usr/bin/nvidia-smi", "/usr/bin/nvidia-smi"),
            ],
        },
    }
    # What the probe then decides: CDI, by the agent's spec.
    specs = gpu_delivery.read_specs((str(root / "etc/cdi"),))
    decided = gpu_delivery.decide(gpu_delivery.DeliveryFacts(cdi_spec_dirs=("/etc/cdi",), specs=specs))
    assert decided["method"] == "cdi" and "gpuhost-nvidia.yaml names 2 GPU(s) by UUID" in decided["detail"]


def test_the_spec_is_rewritten_when_the_driver_changes_and_left_alone_otherwise(root: Path) -> None:
    path = Path(driver_cdi.keep(_nvml(), DOCKER, root)["path"])
    written = path.stat().st_mtime_ns
    assert driver_cdi.keep(_nvml(), DOCKER, root)["detail"].startswith("in place")
    assert path.stat().st_mtime_ns == written
    _driver_root(root, version="570.86.10", gpus=3)
    three = {"driverVersion": "570.86.10", "gpus": [*_nvml()["gpus"], {"minorNumber": 2, "uuid": "GPU-2"}]}
    kept = driver_cdi.keep(three, DOCKER, root)
    assert kept["detail"] == "written for 3 GPU(s), driver 570.86.10"
    text = path.read_text()
    assert "libcuda.so.570.86.10" in text and "libcuda.so.550" not in text and "/dev/nvidia2" in text


def test_a_spec_of_the_toolkits_that_names_the_gpus_wins_and_the_agents_goes(root: Path) -> None:
    ours = Path(driver_cdi.keep(_nvml(), DOCKER, root)["path"])
    toolkit = root / "var/run/cdi/nvidia.yaml"
    toolkit.parent.mkdir(parents=True)
    toolkit.write_text(
        yaml.safe_dump({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [{"name": u} for u in UUIDS]})
    )
    kept = driver_cdi.keep(_nvml(), DOCKER, root)
    assert kept == {"path": None, "detail": f"{toolkit} names the GPUs by UUID: used as it is"}
    assert not ours.exists()


@pytest.mark.parametrize(
    ("breakage", "said"),
    [
        (lambda root: (root / "dev/nvidia1").unlink(), "no device node /dev/nvidia1"),
        (lambda root: (root / LIBDIR / "libcuda.so.1").unlink(), "no libcuda.so.1 of driver 550.54.15"),
        (lambda root: (root / "dev/nvidiactl").unlink(), "no /dev/nvidiactl"),
        (
            lambda root: (root / "dev/nvidia0").unlink() or (root / "dev/nvidia0").write_text(""),
            "no device node /dev/nvidia0",
        ),
    ],
)
def test_a_driver_missing_a_piece_gets_no_spec_and_says_which(root: Path, breakage, said) -> None:
    driver_cdi.keep(_nvml(), DOCKER, root)
    breakage(root)
    kept = driver_cdi.keep(_nvml(), DOCKER, root)
    assert kept["path"] is None and said in kept["detail"], kept
    assert not (root / "etc/cdi" / cdi_spec.SPEC_FILE).exists()  # a half-true spec is none


def test_without_dockerds_cdi_feature_nothing_is_written(root: Path) -> None:
    assert driver_cdi.keep(_nvml(), {"cdiSpecDirs": []}, root)["path"] is None
    assert not (root / "etc/cdi").exists()


def test_probe_and_doctor_look_at_the_agents_spec_and_write_nothing(root: Path) -> None:
    """`probe` and `doctor` say which spec is in use and why (driver_cdi.look): the running agent's
    file is theirs to read, never to write or remove."""
    ours = root / "etc/cdi" / cdi_spec.SPEC_FILE
    looked = driver_cdi.look(_nvml(), DOCKER, root)
    assert looked == {
        "path": None,
        "detail": f"{ours} not written yet: the running agent writes it for 2 GPU(s), driver {VERSION}",
    }
    assert not ours.exists()
    driver_cdi.keep(_nvml(), DOCKER, root)
    assert driver_cdi.look(_nvml(), DOCKER, root) == {
        "path": str(ours),
        "detail": f"in place for 2 GPU(s), driver {VERSION}",
    }
    _driver_root(root, version="570.86.10")
    looked = driver_cdi.look({**_nvml(), "driverVersion": "570.86.10"}, DOCKER, root)
    assert looked["path"] is None and "out of date" in looked["detail"] and "570.86.10" in looked["detail"]
    assert f"libcuda.so.{VERSION}" in ours.read_text()  # left as the agent wrote it
    (root / "dev/nvidiactl").unlink()
    looked = driver_cdi.look({**_nvml(), "driverVersion": "570.86.10"}, DOCKER, root)
    assert looked["path"] is None and "no /dev/nvidiactl" in looked["detail"] and ours.exists()


def test_a_driver_beside_the_systems_is_mounted_where_a_containers_loader_looks(tmp_path: Path) -> None:
    """The GPU test machine's layout (docs/hardware/facts-NVIDIA-H200.txt): the driver's libraries in
    /usr/local/nvidia/lib64 and its tools in /usr/local/nvidia/bin, which no image's loader or PATH
    searches by itself: they are mounted into the C library's multiarch folder and /usr/bin."""
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    _driver_root(tmp_path, gpus=1)
    for name in ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler"):
        for file in (tmp_path / LIBDIR).glob(f"{name}.so*"):
            file.unlink()
    (tmp_path / "usr/bin/nvidia-smi").unlink()
    nvidia = tmp_path / "usr/local/nvidia"
    (nvidia / "lib64").mkdir(parents=True)
    (nvidia / "bin").mkdir()
    (nvidia / "lib64" / f"libcuda.so.{VERSION}").write_bytes(b"\x7fELF stand-in")
    (nvidia / "lib64/libcuda.so.1").symlink_to(f"libcuda.so.{VERSION}")
    (nvidia / "bin/nvidia-smi").write_text("#!/bin/sh\n")
    files = driver_cdi.find_driver_files(tmp_path, VERSION)
    multiarch = f"/usr/lib/{os.uname().machine}-linux-gnu"
    assert [(m.host, m.container) for m in files.libraries] == [
        (str(nvidia / "lib64" / f"libcuda.so.{VERSION}"), f"{multiarch}/libcuda.so.{VERSION}"),
        (str(nvidia / "lib64" / f"libcuda.so.{VERSION}"), f"{multiarch}/libcuda.so.1"),
    ]
    assert [(m.host, m.container) for m in files.binaries] == [(str(nvidia / "bin/nvidia-smi"), "/usr/bin/nvidia-smi")]
    assert driver_cdi.keep(_nvml(gpus=1), DOCKER, tmp_path)["path"]


def test_a_driver_root_of_its_own_gives_host_paths_under_it_and_the_spec_stays_where_dockerd_reads(
    tmp_path: Path,
) -> None:
    """GPUHOST_DRIVER_ROOT (as nvidia-ctk's --driver-root): the nodes, libraries and tools are found
    and mounted from under it, at the container's usual paths; the spec is still written in dockerd's
    folder, not under the driver's root."""
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    system, driver = tmp_path / "system", tmp_path / "driver"
    system.mkdir()
    driver.mkdir()
    _driver_root(driver)
    kept = driver_cdi.keep(_nvml(), DOCKER, system, driver_root=driver)
    assert kept["path"] == str(system / "etc/cdi" / cdi_spec.SPEC_FILE), kept
    assert not (driver / "etc").exists()
    spec = yaml.safe_load(Path(kept["path"]).read_text())
    (first, _) = spec["devices"]
    assert first["containerEdits"]["deviceNodes"] == [{"path": "/dev/nvidia0", "hostPath": str(driver / "dev/nvidia0")}]
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    assert mounts[f"/{LIBDIR}/libcuda.so.1"] == str(driver / LIBDIR / f"libcuda.so.{VERSION}")
    assert driver_cdi.look(_nvml(), DOCKER, system, driver_root=driver)["path"] == kept["path"]
    # Without the driver root, the same system root has no driver: no spec.
    assert driver_cdi.keep(_nvml(), DOCKER, system)["path"] is None


def test_before_dockerd_starts_a_spec_from_before_a_reboot_is_made_true_or_removed(root: Path) -> None:
    """A GPU's minor number follows the order the driver found the GPUs in, so after a
    reboot with a GPU missing /dev/nvidia1 may be another GPU. Docker's unit runs `gpuhost-agent cdi
    refresh` first: the agent's spec is rewritten for the GPUs NVML sees now, or removed where NVML
    sees none (the driver not loaded yet: no spec beats a wrong one); no spec of its own, nothing."""
    ours = Path(driver_cdi.keep(_nvml(), DOCKER, root)["path"])
    assert driver_cdi.refresh(_nvml(), root) == [f"{ours}: in place for 2 GPU(s), driver {VERSION}"]
    # After the reboot the first GPU is gone and the second one is /dev/nvidia0.
    (root / "dev/nvidia1").unlink()
    after = {"driverVersion": VERSION, "gpus": [{"index": 0, "minorNumber": 0, "uuid": UUIDS[1]}]}
    assert driver_cdi.refresh(after, root) == [f"{ours}: written for 1 GPU(s), driver {VERSION}"]
    (device,) = yaml.safe_load(ours.read_text())["devices"]
    assert device["name"] == UUIDS[1] and device["containerEdits"]["deviceNodes"][0]["path"] == "/dev/nvidia0"
    # NVML answers nothing yet: the spec goes.
    said = driver_cdi.refresh({"available": False, "gpus": []}, root)
    assert said == [f"{ours}: no spec written: no NVIDIA driver version (removed)"] and not ours.exists()
    assert driver_cdi.refresh(_nvml(), root) == [] and not ours.exists()  # never written where there was none


def test_the_agents_own_file_is_never_taken_for_another_spec_and_a_stale_copy_goes(root: Path) -> None:
    """The agent's spec seen through a linked folder (here /var/run/cdi linked to /etc/cdi)
    is not "a toolkit spec naming the GPUs" (it stays, no flapping), and a copy of it left in another of
    dockerd's folders is removed (two specs naming one device make it unusable)."""
    (root / "var/run").mkdir(parents=True)
    (root / "var/run/cdi").symlink_to(root / "etc/cdi")
    ours = Path(driver_cdi.keep(_nvml(), DOCKER, root)["path"])
    assert driver_cdi.keep(_nvml(), DOCKER, root) == {
        "path": str(ours),
        "detail": f"in place for 2 GPU(s), driver {VERSION}",
    }
    (root / "var/run/cdi").unlink()
    (root / "var/run/cdi").mkdir()
    copy = root / "var/run/cdi" / cdi_spec.SPEC_FILE
    copy.write_text(ours.read_text())
    assert driver_cdi.keep(_nvml(), DOCKER, root)["detail"].startswith("in place")
    assert ours.is_file() and not copy.exists()


def test_a_gpu_another_spec_names_stays_out_of_the_agents(root: Path) -> None:
    """A toolkit spec naming some of the GPUs by UUID; the agent's names the others only,
    so no device is named twice."""
    toolkit = root / "etc/cdi/nvidia.yaml"
    toolkit.parent.mkdir(parents=True)
    toolkit.write_text(
        yaml.safe_dump({"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": [{"name": UUIDS[0]}]})
    )
    kept = driver_cdi.keep(_nvml(), DOCKER, root)
    assert kept["detail"] == f"written for 1 GPU(s), driver {VERSION} (1 more named by another spec)", kept
    assert [device["name"] for device in yaml.safe_load(Path(kept["path"]).read_text())["devices"]] == [UUIDS[1]]


def test_a_fifo_of_a_specs_name_and_a_linked_node_are_not_read_as_the_real_thing(root: Path) -> None:
    """A FIFO named like a spec would hold the probe forever, and a GPU node that is a
    link passes a check that follows it but fails at the container's start (the CDI library does not)."""
    fifo = root / "etc/cdi/stray.yaml"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    assert driver_cdi.keep(_nvml(), DOCKER, root)["path"]  # returns: the FIFO was not opened
    (root / "dev/nvidia1").unlink()
    (root / "dev/nvidia1").symlink_to(root / "dev/nvidia0")
    kept = driver_cdi.keep(_nvml(), DOCKER, root)
    assert kept["path"] is None and "no device node /dev/nvidia1" in kept["detail"], kept
