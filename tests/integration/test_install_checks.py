"""install.sh on a fresh Debian 12 that lacks something: it stops, says what is
missing and how to get it, and changes nothing; --install-missing and --dry-run.
(The chroots: tests/support/install_chroot.py. Needs root.)
"""

from __future__ import annotations

from support.install_chroot import CHECKOUT_IN_ROOT, ENV_ID, KEY, URL, Scenario, add, assert_not_installed, needs_root
from support.install_script import allowed, msg, too_old


@needs_root
def test_a_bare_debian_stops_with_what_is_missing_and_changes_nothing(scenario: Scenario) -> None:
    result = scenario.install("--url", URL, "--env-id", ENV_ID, "--api-key", KEY)
    assert result.code == 3, result.both
    for prefix in ("Docker Engine is not installed", "NVIDIA driver not found", "NVIDIA Container Toolkit not found"):
        assert f"install.sh: error: {msg(prefix)}\n" in result.err, (prefix, result.err)
    assert f"install.sh: warning: {msg('Docker Compose v2 is missing')}\n" in result.err
    assert "nothing was changed" in result.err
    assert KEY not in result.both
    assert_not_installed(scenario)


@needs_root
def test_each_missing_piece_has_its_documented_message(scenario: Scenario) -> None:
    add(scenario, "docker", "compose", "nvidia", "toolkit")
    args = ("--url", URL, "--env-id", ENV_ID, "--api-key", KEY)
    cases = [
        ("touch /etc/fake/docker-down", "error", "Docker Engine does not answer", "rm /etc/fake/docker-down"),
        ("touch /etc/fake/nvidia-broken", "error", "nvidia-smi is installed but fails", "rm /etc/fake/nvidia-broken"),
        (
            "rm /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
            "error",
            "NVIDIA driver not found",
            "touch /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        ),
        (
            "rm /usr/local/bin/nvidia-ctk",
            "error",
            "NVIDIA Container Toolkit not found",
            "install -m 0755 /usr/local/share/fake/nvidia-ctk /usr/local/bin/",
        ),
        ("dpkg -r python3-venv python3.11-venv >/dev/null", "error", "python3 (3.10 or later)", "true"),
    ]
    for break_it, level, prefix, repair in cases:
        scenario.sh(break_it)
        result = scenario.install(*args)
        assert result.code == 3, (prefix, result.both)
        assert f"install.sh: {level}: {msg(prefix)}\n" in result.err, (prefix, result.err)
        assert result.err.count("install.sh: error:") == 1, (prefix, result.err)
        scenario.sh(repair)
    assert_not_installed(scenario)


@needs_root
def test_without_root_it_says_how_to_run_it(scenario: Scenario) -> None:
    scenario.sh(f"install -m 0755 {CHECKOUT_IN_ROOT}/install.sh /usr/local/share/install.sh")  # /root is 0700
    result = scenario.run(
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "/usr/local/share/install.sh",
        "--url",
        URL,
        "--env-id",
        ENV_ID,
        "--api-key",
        KEY,
    )
    assert result.code == 3
    assert f"install.sh: error: {msg('install.sh must run as root')}\n" in result.err


@needs_root
def test_allow_no_gpu_makes_the_gpu_pieces_warnings_and_old_versions_are_flagged(scenario: Scenario) -> None:
    add(scenario, "docker", "compose")
    scenario.sh("touch /etc/fake/docker-down")
    result = scenario.install("--url", URL, "--env-id", ENV_ID, "--api-key", KEY, "--allow-no-gpu")
    assert result.code == 3  # Docker is still required
    # Warnings now, and none tells the host to pass the --allow-no-gpu it passed.
    assert f"install.sh: warning: {allowed(msg('NVIDIA driver not found'))}\n" in result.err
    assert f"install.sh: warning: {allowed(msg('NVIDIA Container Toolkit not found'))}\n" in result.err
    assert "--allow-no-gpu" not in result.err
    assert result.err.count("install.sh: error:") == 1 and msg("Docker Engine does not answer") in result.err

    # Every version below doctor's minimum is a warning, worded as doctor words it.
    scenario.sh(
        "rm /etc/fake/docker-down; echo 1.16.2 >/etc/fake/toolkit-version\n"
        "echo 20.10.24+dfsg1 >/etc/fake/docker-version; echo 2.12.2 >/etc/fake/compose-version\n"
        "echo 470.239.06 >/etc/fake/driver-version; echo 11.4 >/etc/fake/cuda-version"
    )
    add(scenario, "nvidia", "toolkit")
    result = scenario.install("--url", URL, "--env-id", ENV_ID, "--api-key", KEY, "--dry-run")
    assert result.code == 0, result.both
    for prefix, found in (
        ("NVIDIA driver VERSION", "470.239.06"),
        ("the driver's CUDA VERSION", "11.4"),
        ("NVIDIA Container Toolkit VERSION", "1.16.2"),
        ("Docker Engine VERSION", "20.10.24+dfsg1"),
        ("Docker Compose VERSION", "2.12.2"),
    ):
        assert f"install.sh: warning: {too_old(prefix, found)}\n" in result.err, (prefix, result.err)
    assert "install.sh: error:" not in result.err

    # At the minimums: no warning.
    scenario.sh(
        "echo 1.17.8 >/etc/fake/toolkit-version; echo 24.0.7 >/etc/fake/docker-version\n"
        "echo 2.20.0 >/etc/fake/compose-version; echo 535.183.01 >/etc/fake/driver-version\n"
        "echo 12.2 >/etc/fake/cuda-version"
    )
    result = scenario.install("--url", URL, "--env-id", ENV_ID, "--api-key", KEY, "--dry-run")
    assert result.code == 0 and "is older than" not in result.err, result.both


@needs_root
def test_a_first_install_needs_url_env_id_and_key(scenario: Scenario) -> None:
    add(scenario, "docker", "compose", "nvidia", "toolkit")
    for args in (
        (),
        ("--url", URL, "--env-id", ENV_ID),
        ("--url", "http://m.example/api", "--env-id", ENV_ID, "--api-key", KEY),
    ):
        result = scenario.install(*args)
        assert result.code == 2, (args, result.both)
        assert KEY not in result.both
    assert_not_installed(scenario)


@needs_root
def test_install_missing_asks_apt_and_dry_run_only_says_so(scenario: Scenario) -> None:
    scenario.sh("printf 'docker.io\\nnvidia-container-toolkit\\n' >/etc/fake/apt-candidates")
    add(scenario, "nvidia")
    before = scenario.tree()
    result = scenario.install("--url", URL, "--env-id", ENV_ID, "--api-key", KEY, "--install-missing", "--dry-run")
    assert result.code == 0, result.both
    assert (
        "would run: env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
        "docker.io nvidia-container-toolkit" in result.out
    )
    assert not [call for call in scenario.calls() if call.startswith("apt-get install")]
    assert scenario.tree() == before
