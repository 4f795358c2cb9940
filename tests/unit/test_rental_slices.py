"""A rental's slice when dockerd uses the systemd cgroup driver. systemd
cannot run on this machine (PID 1 is not systemd), so the lowest layer is a
stand-in: the commands are recorded and answered as systemd answers them,
and the slice's cgroup is a folder standing in for /sys/fs/cgroup. What is
checked is what systemd and runc are given: the D-Bus call's exact
arguments, the slice's place in the tree as runc expands it, and the files
the limit events are read from."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gpuhost_agent.runtime.rental_cgroups import CgroupError, RentalCgroups, RentalLimits
from gpuhost_agent.runtime.rental_slices import RentalSlices

LIMITS = RentalLimits(memory_bytes=2 * 1024**3, cpus=1.5, pids=512)
ESCAPED = "gpuhost-rab\\x2dcd.slice"
SYSTEMD_257_EXISTS = "Unit {} was already loaded or has a fragment file."


class Systemd:
    """Records each command; answers StartTransientUnit like systemd does for
    a unit that already exists when told so (in systemd 257's words, as
    Debian 13's systemd said them on the modern host; `exists` for others)."""

    def __init__(self, existing: set[str] | None = None, refuse: str = "", exists: str = SYSTEMD_257_EXISTS):
        self.calls: list[list[str]] = []
        self.existing, self.refuse, self.exists = existing or set(), refuse, exists

    def __call__(self, argv: list[str]) -> subprocess.CompletedProcess:
        self.calls.append(argv)
        if self.refuse:
            return subprocess.CompletedProcess(argv, 1, "", f"Call failed: {self.refuse}\n")
        if argv[:2] == ["busctl", "call"] and argv[7] in self.existing:
            return subprocess.CompletedProcess(argv, 1, "", f"Call failed: {self.exists.format(argv[7])}\n")
        return subprocess.CompletedProcess(argv, 0, "", "")


def runc_expand(name: str) -> str:
    """runc's systemd.ExpandSlice (libcontainer/cgroups/systemd/common.go):
    each dash is one level down. Written from its documented rules, to check
    where the rental's cgroup lands."""
    assert name.endswith(".slice") and "/" not in name
    path, prefix = "", ""
    for component in name.removesuffix(".slice").split("-"):
        assert component, f"{name}: an empty component is refused by runc"
        path += f"/{prefix}{component}.slice"
        prefix += f"{component}-"
    return path


def _cgroups(root: Path, systemd: Systemd, version: str = "2") -> RentalCgroups:
    (root / "systemd-running").mkdir(parents=True)
    if version == "2":
        (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    else:
        (root / "memory").mkdir()
    slices = RentalSlices(systemd, systemd_running=root / "systemd-running", which=lambda tool: f"/usr/bin/{tool}")
    cgroups = RentalCgroups(root, slices)
    assert cgroups.configure("systemd", version) is None
    return cgroups


def test_each_rental_is_one_slice_below_gpuhost_slice_whatever_dashes_its_id_has(tmp_path) -> None:
    cgroups = _cgroups(tmp_path, Systemd())
    assert cgroups.parent_of("ab-cd") == ESCAPED
    assert runc_expand(ESCAPED) == f"/gpuhost.slice/{ESCAPED}"
    assert runc_expand(cgroups.parent_of("plain") or "") == "/gpuhost.slice/gpuhost-rplain.slice"
    with pytest.raises(CgroupError):
        cgroups.parent_of("../x")


def test_the_limits_are_a_transient_slices_properties(tmp_path) -> None:
    systemd = Systemd()
    _cgroups(tmp_path, systemd).apply("ab-cd", LIMITS)
    assert systemd.calls == [
        [
            "busctl",
            "call",
            "org.freedesktop.systemd1",
            "/org/freedesktop/systemd1",
            "org.freedesktop.systemd1.Manager",
            "StartTransientUnit",
            "ssa(sv)a(sa(sv))",
            ESCAPED,
            "fail",
            "5",
            "Description",
            "s",
            "gpuhost-agent: one rental's containers",
            "MemoryMax",
            "t",
            str(2 * 1024**3),
            "CPUQuotaPerSecUSec",
            "t",
            "1500000",
            "TasksMax",
            "t",
            "512",
            "MemorySwapMax",
            "t",
            "0",
            "0",
        ]
    ]


@pytest.mark.parametrize("exists", [SYSTEMD_257_EXISTS, "Unit {} already exists."])
def test_cgroup_v1_uses_memory_limit_and_a_slice_that_exists_is_limited_again(tmp_path, exists: str) -> None:
    """After an agent restart the slice is still there (transient slices last
    until reboot): its limits are set on it, in systemctl's words, whichever
    way systemd words that the unit exists."""
    systemd = Systemd(existing={ESCAPED}, exists=exists)
    _cgroups(tmp_path, systemd, version="1").apply("ab-cd", LIMITS)
    assert [call[:2] for call in systemd.calls] == [["busctl", "call"], ["systemctl", "set-property"]]
    assert "MemoryLimit" in systemd.calls[0] and "MemorySwapMax" not in systemd.calls[0]
    assert systemd.calls[1] == [
        "systemctl",
        "set-property",
        "--runtime",
        ESCAPED,
        f"MemoryLimit={2 * 1024**3}",
        "CPUQuota=150%",
        "TasksMax=512",
    ]


def test_a_refusal_names_the_slice_and_systemds_words(tmp_path) -> None:
    cgroups = _cgroups(tmp_path, Systemd(refuse="Access denied"))
    with pytest.raises(CgroupError, match=r"gpuhost-rab\\x2dcd.slice could not be limited: .*Access denied"):
        cgroups.apply("ab-cd", LIMITS)


def test_limit_events_are_read_from_the_slices_cgroup(tmp_path) -> None:
    cgroups = _cgroups(tmp_path, Systemd())
    folder = tmp_path / "gpuhost.slice" / ESCAPED
    folder.mkdir(parents=True)
    (folder / "memory.events.local").write_text("low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\n")
    assert cgroups.memory_limit_reached("ab-cd")
    assert not cgroups.memory_limit_reached("ab-cd")


def test_the_slice_is_stopped_only_once_no_container_is_left_in_it(tmp_path) -> None:
    systemd = Systemd()
    cgroups = _cgroups(tmp_path, systemd)
    scope = tmp_path / "gpuhost.slice" / ESCAPED / "docker-0123.scope"
    scope.mkdir(parents=True)
    assert not cgroups.remove("ab-cd")
    assert systemd.calls == []  # stopping it would kill what still runs there
    scope.rmdir()
    assert cgroups.remove("ab-cd")
    assert systemd.calls == [["systemctl", "stop", ESCAPED]]


def test_without_busctl_the_reason_names_it(tmp_path) -> None:
    (tmp_path / "systemd-running").mkdir()
    slices = RentalSlices(Systemd(), systemd_running=tmp_path / "systemd-running", which=lambda tool: None)
    reason = RentalCgroups(tmp_path, slices).configure("systemd", "2") or ""
    assert "busctl and systemctl not found" in reason
