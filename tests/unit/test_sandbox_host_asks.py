"""What published files ask of the host, given on the stack's own terms and
said to the renter, through the real Compose CLI.
Each test failed on the agent before: the port and Compose's warnings were
silent, the reservation stayed above the limit (the engine refused the
container), and host networking and absolute data paths were refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.sandbox_decide import assert_sandboxed, decide_file

from gpuhost_agent.core.sandbox.host_asks import system_path
from gpuhost_agent.runtime.compose import MAX_WARNINGS, ComposeRunner, compose_warnings, find_compose_command

GIB = 1024**3


@pytest.fixture(scope="module")
def compose(tmp_path_factory) -> ComposeRunner:
    return ComposeRunner(find_compose_command(), tmp_path_factory.mktemp("docker-config"))


async def test_a_dropped_host_port_is_said_with_where_the_port_is(compose, tmp_path) -> None:
    text = "services:\n  app:\n    image: busybox\n    ports: ['8787:8080', '9000']\n"
    problems, hardened, notices = await decide_file(compose, text, tmp_path / "stacks" / "s")
    assert problems == [] and hardened is not None
    assert all("published" not in port for port in hardened["services"]["app"]["ports"])
    (said,) = [notice for notice in notices if "ports" in notice]  # 9000 had no host port: nothing to say
    assert 'service "app": ports 8787:8080: host port 8787 dropped' in said
    assert "container port 8080" in said and "PublicPort" in said


async def test_compose_warnings_of_unset_variables_reach_the_notices(compose, tmp_path) -> None:
    text = "services:\n  app:\n    image: busybox\n    environment:\n      HF_TOKEN: ${HF_TOKEN}\n      SET: ${SET}\n"
    problems, _, notices = await decide_file(compose, text, tmp_path / "stacks" / "s", variables={"SET": "1"})
    assert problems == []
    said = [notice for notice in notices if notice.startswith("Compose warns: ")]
    assert said == ['Compose warns: The "HF_TOKEN" variable is not set. Defaulting to a blank string.']


def test_compose_warnings_are_visible_bounded_and_free_of_agent_paths(tmp_path: Path) -> None:
    workdir = tmp_path / "stacks" / "s"
    lines = [
        f'time="t" level=warning msg="{workdir}/compose.yaml: the attribute `version` is obsolete"',
        'time="t" level=warning msg="The \\"A\\x1b]52;c;x\\x07\\" variable is not set."',
        f'time="t" level=warning msg="read {workdir}/x and {tmp_path}/home/y: {"z" * 900}"',
        *[f'time="t" level=warning msg="warning {n}"' for n in range(20)],
        'time="t" level=warning msg="warning 0"',
        "plain progress line",
    ]
    found = compose_warnings("\n".join(lines), workdir, tmp_path / "home")
    assert len(found) == MAX_WARNINGS + 1 and found[-1] == "14 more warning(s) of Compose not shown"
    assert found[0] == 'The "A\\x1b]52;c;x\\x07" variable is not set.'
    assert found[1].startswith("read x and ~/y: zzz") and len(found[1]) == 303
    assert not any(str(tmp_path) in text or "version" in text or "\x1b" in text for text in found)


async def test_a_memory_reservation_above_the_limit_is_lowered_to_it(compose, tmp_path) -> None:
    text = (
        "services:\n"
        "  big:\n    image: busybox\n    deploy: {resources: {reservations: {memory: 64g}}}\n"
        "  capped:\n    image: busybox\n    mem_limit: 1g\n    mem_reservation: 2g\n"
        "  modest:\n    image: busybox\n    mem_reservation: 512m\n"
    )
    problems, hardened, notices = await decide_file(compose, text, tmp_path / "stacks" / "s")
    assert problems == [] and hardened is not None
    services = hardened["services"]
    assert int(services["big"]["deploy"]["resources"]["reservations"]["memory"]) == 8 * GIB  # the share
    capped = services["capped"]
    reserved = capped.get("mem_reservation") or capped["deploy"]["resources"]["reservations"]["memory"]
    assert int(reserved) == GIB == int(capped["mem_limit"])
    assert int(services["modest"].get("mem_reservation") or 0) in (0, 512 * 1024**2)
    assert any('"big": deploy.resources.reservations.memory 64.0 GiB lowered' in n for n in notices), notices
    assert [n for n in notices if '"capped"' in n and "lowered to the container's memory limit (1.0 GiB)" in n]
    assert not [n for n in notices if '"modest"' in n]


async def test_host_network_runs_on_the_stack_network_and_says_how_it_is_reached(compose, tmp_path) -> None:
    text = (
        "services:\n"
        "  vllm:\n    image: busybox\n    network_mode: host\n    ports: ['8000:8000']\n"
        "  worker:\n    image: busybox\n    network_mode: host\n"
    )
    problems, hardened, notices = await decide_file(compose, text, tmp_path / "stacks" / "s")
    assert problems == [] and hardened is not None
    assert_sandboxed(hardened)
    for name in ("vllm", "worker"):
        assert "network_mode" not in hardened["services"][name]
        assert list(hardened["services"][name]["networks"]) == ["default"]
    assert hardened["networks"]["default"]["name"] == "corpus_default"
    assert [n for n in notices if '"vllm": network_mode host became' in n and "port(s) 8000 are reached" in n]
    assert [n for n in notices if '"worker": network_mode host became' in n and "declares no port" in n]


async def test_absolute_data_paths_become_volumes_and_system_paths_stay_refused(compose, tmp_path) -> None:
    text = (
        "services:\n  nim:\n    image: busybox\n    volumes:\n"
        "      - ${MODEL_DIRECTORY}:/opt/nim/.cache\n      - /home/me/data:/data:ro\n      - /root/.cache:/c\n"
    )
    problems, hardened, notices = await decide_file(
        compose, text, tmp_path / "stacks" / "s", variables={"MODEL_DIRECTORY": "/srv/models"}
    )
    assert problems == [] and hardened is not None
    assert_sandboxed(hardened)
    mounts = hardened["services"]["nim"]["volumes"]
    assert [(m["type"], m["source"], m["target"]) for m in mounts] == [
        ("volume", "host_srv_models", "/opt/nim/.cache"),
        ("volume", "host_home_me_data", "/data"),
        ("volume", "host_root_.cache", "/c"),
    ]
    assert hardened["volumes"]["host_srv_models"] == {"name": "corpus_host_srv_models"}
    assert [n for n in notices if "volumes /srv/models became the stack's named volume 'host_srv_models'" in n]
    system = ["/", "/dev/shm", "/proc", "/sys/kernel", "/etc", "/var/run/docker.sock", "/run/x", "/boot"]
    system += ["/usr/lib/wsl", "/lib/firmware", "/tmp/.X11-unix", "/home/me/app.sock", "/var/lib/docker"]
    text = "services:\n  app:\n    image: busybox\n    volumes:\n" + "".join(
        f"      - {path}:/m{n}\n" for n, path in enumerate(system)
    )
    problems, _, _ = await decide_file(compose, text, tmp_path / "stacks" / "t")
    for path in system:
        assert f"bind mount of the host path '{path}' is not allowed" in problems[0], path


@pytest.mark.parametrize(
    ("path", "system"),
    [
        ("//etc", True),
        ("/srv/../etc/passwd", True),
        ("/var/run/../run/docker.sock", True),
        ("/data/./models", False),
        ("/etcetera", False),
        ("/home/me/models", False),
        ("/opt/x/docker.sock", True),
    ],
)
def test_system_paths_are_judged_as_the_kernel_resolves_them(path: str, system: bool) -> None:
    assert system_path(path) is system
