"""Reading dockerd's own no-new-privileges default (runtime/dockerd_settings.py):
the pure reading of a command line and a daemon.json, and the kernel's answer
on a unix socket this test listens on itself."""

from __future__ import annotations

import os
import socket

import pytest

from gpuhost_agent.runtime.dockerd_settings import (
    cgroupns_private,
    config_file,
    engine_no_new_privileges,
    engine_pid,
    engine_socket,
    no_new_privileges,
)


@pytest.mark.parametrize(
    ("cmdline", "daemon_json", "held"),
    [
        (["dockerd", "--no-new-privileges"], None, True),
        (["dockerd", "--no-new-privileges=true"], {}, True),
        (["dockerd", "--no-new-privileges=false"], {"no-new-privileges": True}, False),
        (["dockerd"], {"no-new-privileges": True}, True),
        (["dockerd"], {"no-new-privileges": "true"}, False),  # dockerd wants a boolean
        (["dockerd"], None, False),
        (["/usr/bin/no-new-privileges"], None, False),  # the program's name is not a flag
    ],
)
def test_flag_then_daemon_json(cmdline, daemon_json, held) -> None:
    assert no_new_privileges(cmdline, daemon_json) is held


@pytest.mark.parametrize(
    ("cmdline", "daemon_json", "version", "private"),
    [
        (["dockerd"], None, "1", False),  # cgroup v1's default: the host's namespace
        (["dockerd"], None, "2", True),
        (["dockerd", "--default-cgroupns-mode", "private"], None, "1", True),
        (["dockerd", "--default-cgroupns-mode=host"], {"default-cgroupns-mode": "private"}, "2", False),
        (["dockerd"], {"default-cgroupns-mode": "private"}, "1", True),
        (["dockerd"], {"default-cgroupns-mode": "host"}, "2", False),
        (["dockerd", "--default-cgroupns-mode"], None, "1", False),  # a flag without its value
    ],
)
def test_cgroupns_flag_then_daemon_json_then_the_engines_default(cmdline, daemon_json, version, private) -> None:
    assert cgroupns_private(cmdline, daemon_json, version) is private


def test_which_files_and_sockets() -> None:
    assert config_file(["dockerd"]) == "/etc/docker/daemon.json"
    assert config_file(["dockerd", "--config-file", "/srv/d.json"]) == "/srv/d.json"
    assert config_file(["dockerd", "--config-file=/srv/e.json"]) == "/srv/e.json"
    assert engine_socket(None) == "/var/run/docker.sock"
    assert engine_socket("unix:///run/n1/docker.sock") == "/run/n1/docker.sock"
    assert engine_socket("tcp://127.0.0.1:2375") is None


def test_the_kernel_names_the_process_behind_a_socket(tmp_path) -> None:
    path = str(tmp_path / "engine.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(path)
        listener.listen(1)
        assert engine_pid(path) == os.getpid()
        held, how = engine_no_new_privileges(f"unix://{path}")
    assert held is False and how.startswith(f"dockerd pid {os.getpid()}: ")  # this python has no such flag
    assert engine_no_new_privileges("tcp://10.0.0.1:2375") == (None, "the engine is not on a local unix socket")
    assert engine_no_new_privileges(f"unix://{tmp_path}/none.sock")[0] is None
