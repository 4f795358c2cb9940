"""Each compliance check failing and passing, with a reason a host can act on.
Pure: the checks are a function of a probe and the marketplace's minimums."""

from __future__ import annotations

import copy

import pytest
from support.machine_samples import good_host

from gpuhost_agent.inventory import compliance
from gpuhost_agent.inventory.compliance import evaluate, summary
from gpuhost_agent.inventory.render import doctor_lines
from gpuhost_agent.protocol.requirements import Requirements, version_tuple

GIB = 1024**3


def _set(path: str, value):
    def mutate(data: dict) -> None:
        *parents, last = path.split(".")
        node = data
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[last] = value

    return mutate


def _all(*mutations):
    def mutate(data: dict) -> None:
        for mutation in mutations:
            mutation(data)

    return mutate


# (check id that must fail, how the probe is broken, words the reason must contain, words the fix must contain)
FAILURES = [
    ("nvidia-gpu", _set("nvml.available", False), "no NVIDIA GPU", "install the NVIDIA driver"),
    ("nvidia-gpu", _set("nvml.gpus", []), "NVML lists no GPU", "nvidia-smi"),
    ("driver-version", _set("nvml.driverVersion", "470.239.06"), "older than the required 535.0", "535.0 or newer"),
    ("driver-version", _set("nvml.driverVersion", None), "NVIDIA driver: version unknown", "535.0 or newer"),
    ("cuda-version", _set("nvml.cudaDriverVersion", "11.4"), "CUDA 11.4 is older than the required 12.2", "CUDA 12.2"),
    ("cuda-version", _set("nvml.cudaDriverVersion", None), "version unknown; 12.2 or newer", "CUDA 12.2"),
    ("gpu-models", _set("nvml.gpus.1.name", "NVIDIA A100-SXM4-80GB"), "mixed models", "one model"),
    ("gpu-memory-errors", _set("nvml.gpus.1.eccUncorrectedErrors", 3), "GPU 1", "nvidia-smi -r"),
    (
        "container-toolkit",
        _set("host.nvidiaContainerToolkit.installed", False),
        "not installed",
        "install nvidia-container-toolkit",
    ),
    ("container-toolkit", _set("host.nvidiaContainerToolkit.version", "1.16.2"), "CVE-2025-23266", "1.17.8"),
    ("container-toolkit", _set("host.nvidiaContainerToolkit.version", None), "version unknown", "1.17.8"),
    (
        "toolkit-visible-devices",
        _set("host.nvidiaContainerToolkit.acceptsEnvvarFromUnprivileged", True),
        "NVIDIA_VISIBLE_DEVICES",
        "accept-nvidia-visible-devices-envvar-when-unprivileged = false",
    ),
    ("docker", _set("host.docker.available", False), "unreachable", "Docker Engine 24.0"),
    (
        "docker",
        _set("host.docker.version", "20.10.24+dfsg1"),
        "Docker Engine 20.10.24+dfsg1 is older than the required 24.0",
        "24.0 or newer",
    ),
    ("compose", _set("host.compose.available", False), "Compose", "docker-compose-plugin"),
    ("compose", _set("host.compose.version", "2.12.2"), "Compose 2.12.2 is older than the required 2.20", "plugin"),
    (
        "gpu-containers",
        _set("host.docker.gpuContainers", {"ok": False, "method": "engine-info", "detail": "no nvidia runtime"}),
        "no nvidia runtime",
        "nvidia-ctk runtime configure",
    ),
    (
        "swarm-no-new-privileges",
        _set("host.docker.swarm", {"state": "active", "nodeId": "n1", "manager": True, "nodes": 2}),
        "does not give containers no-new-privileges",
        '"no-new-privileges": true',
    ),
    (
        "swarm-cgroupns",
        _all(
            _set("host.docker.swarm", {"state": "active", "nodeId": "n1", "manager": True, "nodes": 2}),
            _set("host.docker.noNewPrivileges", {"default": True, "detail": "dockerd pid 1: --no-new-privileges"}),
            _set("host.docker.cgroupnsPrivate", {"default": False, "detail": "dockerd pid 1: cgroup v1"}),
        ),
        "does not give containers a cgroup namespace of its own",
        '"default-cgroupns-mode": "private"',
    ),
    ("disk-space", _set("host.storage.freeBytes", 12 * GIB), "only 12.0 GiB free", "docker system prune"),
    ("disk-space", _set("host.storage.freeBytes", None), "cannot tell the free space", "docker system prune"),
    ("clock-sync", _set("host.clock.synchronized", False), "not synchronised", "timedatectl set-ntp true"),
    ("clock-sync", _set("host.clock.synchronized", None), "cannot tell", "timedatectl"),
    (
        "container-egress-confined",
        _set("host.egress", {"confined": False, "differs": None, "error": "iptables is not installed: ..."}),
        "iptables is not installed",
        "apt install iptables",
    ),
    (
        "container-egress-confined",
        _set("host.egress", {"confined": False, "differs": "no jump iptables INPUT -> GPUHOST-HOST", "error": None}),
        "not in place (no jump iptables INPUT -> GPUHOST-HOST)",
        "systemctl start gpuhost-agent",
    ),
    (
        "container-egress-confined",
        _set("host.egress", {"confined": None, "differs": None, "error": "Permission denied (you must be root)"}),
        "cannot read the host's firewall: Permission denied",
        "as root",
    ),
    (  # a stack deployed before the rules: its br- bridge is outside them
        "container-egress-confined",
        _set("host.egress", {"confined": True, "differs": None, "error": None, "unconfinedNetworks": ["s-1_default"]}),
        "1 network(s) of stacks deployed before the egress rules are outside them (s-1_default)",
        "deploy those stacks again",
    ),
    (  # dockerd resolves a renter's registry again when it pulls
        "registry-pulls-guarded",
        _set("host.pullGuard", {"listen": None, "error": None}),
        "the pull guard is off",
        "remove GPUHOST_PULL_GUARD=off",
    ),
    (
        "registry-pulls-guarded",
        _set("host.pullGuard.error", "127.0.0.1:47128 is another program's, not the pull guard"),
        "does not answer on 127.0.0.1:47128 (127.0.0.1:47128 is another program's",
        "pull_guard_not_listening",
    ),
    (
        "registry-pulls-guarded",
        _set("host.docker.proxies", {"http": "", "https": "http://127.0.0.1:9", "no": ""}),
        "do not go through the pull guard (HTTP proxy none, HTTPS proxy http://127.0.0.1:9)",
        "systemctl restart docker",
    ),
    (  # Go bypasses the proxy for each of these
        "registry-pulls-guarded",
        _set("host.docker.proxies.no", "127.0.0.1,::1,localhost,169.254.169.254,.com,0.0.0.0/0"),
        "NO_PROXY sends 169.254.169.254, .com, 0.0.0.0/0 around it",
        "systemctl restart docker",
    ),
    (  # dockerd sends a loopback target to no proxy; the kernel fence holds it
        "registry-pulls-guarded",
        _set("host.docker.fence", {"group": None, "dockerd": None, "detail": None}),
        "no group gpuhost-engine for the engine fence",
        "makes the group",
    ),
    (
        "registry-pulls-guarded",
        _set("host.docker.fence", {"group": 990, "dockerd": False, "detail": None}),
        "dockerd is not in the group gpuhost-engine",
        "systemctl restart docker",
    ),
    (
        "registry-pulls-guarded",
        _set("host.docker.proxies.no", "localhost, *"),
        "NO_PROXY sends * around it",
        "daemon.json",
    ),
]


def test_a_good_host_passes_every_check() -> None:
    checks = evaluate(good_host(), Requirements(), clock_skew_seconds=0.4)
    assert [check.id for check in checks if not check.ok] == []
    assert {check.id for check in checks} == {row[0] for row in FAILURES} | {"clock-skew"}
    assert summary(checks) == (True, "")
    assert all(check.remedy == "" for check in checks)


@pytest.mark.parametrize(
    "check_id, breakage, reason_words, remedy_words",
    FAILURES,
    ids=[f"{row[0]}-{index}" for index, row in enumerate(FAILURES)],
)
def test_each_check_fails_alone_with_an_actionable_reason(check_id, breakage, reason_words, remedy_words) -> None:
    data = copy.deepcopy(good_host())
    breakage(data)
    checks = evaluate(data, Requirements())
    failed = [check for check in checks if not check.ok]
    assert [check.id for check in failed] == [check_id]
    assert reason_words in failed[0].summary and remedy_words in failed[0].remedy
    ok, reason = summary(checks)
    assert ok is False and failed[0].summary in reason
    # doctor runs offline with the default minimums: no sentence claims a marketplace asked for them
    assert "marketplace" not in failed[0].summary


def test_clock_skew_against_the_marketplace() -> None:
    checks = {c.id: c for c in evaluate(good_host(), Requirements(maxClockSkewSeconds=2), clock_skew_seconds=-7.5)}
    assert not checks["clock-skew"].ok and "-7.5 s off" in checks["clock-skew"].summary
    assert "clock-skew" not in {c.id for c in evaluate(good_host(), Requirements())}  # not measured: not judged


def test_marketplace_minimums_replace_the_defaults() -> None:
    strict = Requirements.from_wire({"minDriverVersion": "560.0", "minFreeDiskGiB": 1000, "minCudaVersion": "12.6"})
    failed = {c.id for c in evaluate(good_host(), strict) if not c.ok}
    assert failed == {"driver-version", "cuda-version", "disk-space"}


def test_malformed_minimums_fall_back_to_defaults() -> None:
    parsed = Requirements.from_wire(
        {
            "minDriverVersion": "soon",
            "minFreeDiskGiB": -5,
            "maxClockSkewSeconds": True,
            "minDockerVersion": 25,
            "unknown": "x",
        }
    )
    assert parsed == Requirements()
    assert Requirements.from_wire(None) == Requirements()


def test_a_marketplace_cannot_lower_the_toolkit_below_the_cve_fix() -> None:
    data = good_host()
    data["host"]["nvidiaContainerToolkit"]["version"] = "1.16.1"
    lax = Requirements.from_wire({"minContainerToolkitVersion": "1.14.0"})
    check = next(c for c in evaluate(data, lax) if c.id == "container-toolkit")
    assert not check.ok and compliance.TOOLKIT_SAFE_VERSION in check.remedy


def test_versions_compare_as_numbers() -> None:
    assert version_tuple("550.54.15") == (550, 54, 15)
    assert version_tuple("v2.29.1-desktop.1") == (2, 29, 1)
    assert version_tuple("20.10.24+dfsg1") == (20, 10, 24)
    assert version_tuple("garbage") == ()
    assert compliance.at_least("1.17.10", "1.17.8") and not compliance.at_least("1.9.0", "1.17.8")
    assert not compliance.at_least(None, "1.0")


def test_doctor_text_shows_pass_fail_and_the_fix() -> None:
    data = good_host()
    data["host"]["clock"]["synchronized"] = False
    text = doctor_lines([check.as_wire() for check in evaluate(data, Requirements())])
    assert "[PASS] docker" in text and "[FAIL] clock-sync" in text
    assert "fix: enable time synchronisation" in text and text.endswith("NOT compliant: 1 check(s) failed")
    good = doctor_lines([check.as_wire() for check in evaluate(good_host(), Requirements())])
    assert "FAIL" not in good and good.endswith("compliant: this host can be listed")


def _no_driver() -> dict:
    """A machine without the NVIDIA driver (and so without the toolkit), as the probe sees it."""
    data = copy.deepcopy(good_host())
    data["nvml"].update(available=False, error="NVML Shared Library Not Found", driverVersion=None, gpus=[])
    data["nvml"]["cudaDriverVersion"] = None
    data["host"]["nvidiaContainerToolkit"].update(installed=False, version=None)
    return data


def test_a_missing_driver_fails_once_and_what_cannot_apply_is_skipped() -> None:
    """No "NVIDIA driver missing is older than ..." and no PASS for
    the models and memory errors of zero GPUs, or for a toolkit setting with no toolkit."""
    checks = {check.id: check for check in evaluate(_no_driver(), Requirements())}
    failed = sorted(check_id for check_id, check in checks.items() if not check.ok)
    assert failed == ["container-toolkit", "nvidia-gpu"]  # the driver counts once, the toolkit is its own install
    skipped = {check_id: check.summary for check_id, check in checks.items() if check.skipped}
    assert sorted(skipped) == [
        "cuda-version",
        "driver-version",
        "gpu-memory-errors",
        "gpu-models",
        "swarm-cgroupns",  # a machine of its own
        "swarm-no-new-privileges",
        "toolkit-visible-devices",
    ]
    assert all(text.startswith("skipped: ") for text in skipped.values())
    assert "no NVIDIA driver" in skipped["driver-version"] and "no GPU" in skipped["gpu-models"]
    assert all(checks[check_id].ok and checks[check_id].remedy == "" for check_id in skipped)
    ok, reason = summary(list(checks.values()))
    assert not ok and reason.count("NVIDIA driver") == 0 and "older than" not in reason
    assert checks["gpu-models"].as_wire()["skipped"] is True and checks["docker"].as_wire()["skipped"] is False


def test_a_driver_without_gpus_is_still_judged_and_the_gpu_checks_are_skipped() -> None:
    data = copy.deepcopy(good_host())
    data["nvml"]["gpus"] = []
    checks = {check.id: check for check in evaluate(data, Requirements())}
    assert checks["driver-version"].ok and not checks["driver-version"].skipped
    assert checks["gpu-models"].skipped and checks["gpu-memory-errors"].skipped
    assert [check_id for check_id, check in checks.items() if not check.ok] == ["nvidia-gpu"]


def test_doctor_text_says_skip_with_the_reason() -> None:
    text = doctor_lines([check.as_wire() for check in evaluate(_no_driver(), Requirements())])
    assert "[SKIP] gpu-models               no GPU, so no models to compare\n" in text
    assert "[PASS] gpu-models" not in text and "[PASS] toolkit-visible-devices" not in text
    assert text.endswith("NOT compliant: 2 check(s) failed")


@pytest.mark.parametrize(
    ("missing", "failing", "reason"),
    [
        ("host.nvidiaContainerToolkit.installed", "container-toolkit", "no NVIDIA Container Toolkit"),
        ("host.docker.available", "docker", "unreachable"),
    ],
)
def test_gpu_containers_not_counted_again_when_the_engine_or_toolkit_is_missing(missing, failing, reason) -> None:
    """One missing piece fails once: Docker cannot give GPUs without an engine
    or a toolkit, and the host's fix starts with the piece that is missing."""
    data = copy.deepcopy(good_host())
    _set(missing, False)(data)
    _set("host.docker.gpuContainers", {"ok": False, "method": "engine-info", "detail": "no nvidia runtime"})(data)
    checks = {check.id: check for check in evaluate(data, Requirements())}
    assert [check_id for check_id, check in checks.items() if not check.ok] == [failing]
    assert checks["gpu-containers"].skipped and reason in checks["gpu-containers"].summary
