"""install.sh on a fresh Debian 12: install, upgrade and uninstall on a booted host,
a pinned install on a GPU-less chroot, and a Swarm worker's install.
(--help, options and the script routes alone: tests/unit/test_install_script.py;
the chroots: tests/support/install_chroot.py. Needs root.)
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from support import locks
from support.install_chroot import (
    CHECKOUT_IN_ROOT,
    ENV_ID,
    KEY,
    UNIT,
    URL,
    Scenario,
    add,
    assert_not_installed,
    conf_values,
    needs_root,
)
from support.install_script import allowed, msg

from gpuhost_agent import __version__
from gpuhost_agent.service import swarm_tls

# ---- install, upgrade, uninstall -----------------------------------------------------------

INSTALLED = (
    "/opt/gpuhost-agent/venv/bin/gpuhost-agent",
    "/usr/local/bin/gpuhost-agent",
    "/etc/gpuhost-agent",
    "/etc/gpuhost-agent/agent.conf",
    "/etc/gpuhost-agent/api-key",
    "/var/lib/gpuhost-agent",
    "/etc/systemd/system/gpuhost-agent.service",
    "/etc/systemd/system/docker.service.d/10-gpuhost-egress.conf",
    "/etc/systemd/system/gpuhost-agent.service.d/10-install-restart-backoff.conf",
)


@needs_root
def test_install_upgrade_and_uninstall_on_a_booted_host(scenario: Scenario) -> None:
    add(scenario, "docker", "nvidia", "toolkit", "systemd")
    # Compose is missing; apt has Docker's plugin, and "installing" it makes `docker compose` work.
    scenario.sh(
        "echo docker-compose-plugin >/etc/fake/apt-candidates\n"
        "printf '#!/bin/sh\\ntouch /etc/fake/compose\\n' >/etc/fake/apt-hooks/docker-compose-plugin\n"
        "chmod +x /etc/fake/apt-hooks/docker-compose-plugin"
    )
    args = ("--url", URL, "--env-id", ENV_ID, "--api-key", KEY)

    # --dry-run: says what it would do, changes nothing, shows no key.
    before = scenario.tree()
    dry = scenario.install(*args, "--dry-run")
    assert dry.code == 0, dry.both
    for expected in (
        "would run: python3 -m venv /opt/gpuhost-agent/venv",
        f"would run: /opt/gpuhost-agent/venv/bin/python -m pip install --quiet --disable-pip-version-check "
        f"--require-hashes --no-build-isolation -r {CHECKOUT_IN_ROOT}/requirements/agent.lock",
        f"would run: /opt/gpuhost-agent/venv/bin/python -m pip install --upgrade --quiet "
        f"--disable-pip-version-check --no-deps --no-build-isolation {CHECKOUT_IN_ROOT}",
        "would: writing /etc/gpuhost-agent",
        "would: installing the unit",
        "would run: env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "
        "docker-compose-plugin",
        "would run: systemctl restart --no-block gpuhost-agent.service",
        "nothing was changed",
    ):
        assert expected in dry.out, (expected, dry.out)
    assert KEY not in dry.both
    assert scenario.tree() == before
    assert not [call for call in scenario.calls() if call.startswith(("apt-get install", "systemctl enable"))]

    # First install, from the checkout.
    first = scenario.install(*args)
    assert first.code == 0, first.both
    assert KEY not in first.both
    assert "cannot reach the marketplace" in first.err  # and it went on regardless
    files = scenario.files(*INSTALLED)
    assert all(files[path] is not None for path in INSTALLED), files
    assert files["/etc/gpuhost-agent"]["mode"] == "0o750"
    assert files["/etc/gpuhost-agent/agent.conf"]["mode"] == "0o640"
    assert files["/etc/gpuhost-agent/api-key"]["mode"] == "0o600"
    assert files["/var/lib/gpuhost-agent"]["mode"] == "0o700"
    assert files["/etc/systemd/system/gpuhost-agent.service"]["mode"] == "0o644"
    assert all(files[path]["uid"] == 0 and files[path]["gid"] == 0 for path in INSTALLED)
    assert files["/usr/local/bin/gpuhost-agent"]["target"] == "/opt/gpuhost-agent/venv/bin/gpuhost-agent"
    assert scenario.read("/etc/gpuhost-agent/api-key") == KEY + "\n"
    conf = conf_values(scenario.read("/etc/gpuhost-agent/agent.conf"))
    assert conf == {
        "GPUHOST_MARKETPLACE_URL": URL,
        "GPUHOST_ENV_ID": ENV_ID,
        "GPUHOST_API_KEY_FILE": "/etc/gpuhost-agent/api-key",
        "GPUHOST_STATE_DIR": "/var/lib/gpuhost-agent",
    }
    assert scenario.read("/etc/systemd/system/gpuhost-agent.service") == UNIT.read_text()
    assert "RestartSteps=" in scenario.read(INSTALLED[-1])  # the stand-in says systemd 255
    # Docker's unit writes the egress rules before dockerd starts: at boot too.
    docker_dropin = scenario.read("/etc/systemd/system/docker.service.d/10-gpuhost-egress.conf")
    assert "\nExecStartPre=-/opt/gpuhost-agent/venv/bin/gpuhost-agent egress apply\n" in docker_dropin
    # ... and makes the agent's CDI spec true for the GPUs now, or removes it (after a reboot a
    # GPU's node number may be another's). Here no driver answers: a spec left behind goes.
    assert "\nExecStartPre=-/opt/gpuhost-agent/venv/bin/gpuhost-agent cdi refresh\n" in docker_dropin
    scenario.sh("mkdir -p /etc/cdi && echo 'kind: nvidia.com/gpu' >/etc/cdi/gpuhost-nvidia.yaml")
    refreshed = scenario.run("gpuhost-agent", "cdi", "refresh")
    assert refreshed.code == 0, refreshed.both
    assert refreshed.out.strip() == "/etc/cdi/gpuhost-nvidia.yaml: no spec written: no NVIDIA driver version (removed)"
    assert scenario.files("/etc/cdi/gpuhost-nvidia.yaml")["/etc/cdi/gpuhost-nvidia.yaml"] is None
    assert scenario.run("gpuhost-agent", "version").out.strip() == __version__
    # Every dependency at the version requirements/agent.lock names for Debian 12's Python
    assert locks.differences(scenario.run("/opt/gpuhost-agent/venv/bin/python", "-c", locks.DUMP).out) == []
    # The agent's own config loader reads what was written, key file included.
    loaded = scenario.run(
        "/opt/gpuhost-agent/venv/bin/python",
        "-c",
        "from gpuhost_agent.service import config; c = config.load({});"
        "print(c.marketplace_url, c.env_id, c.api_key == open('/etc/gpuhost-agent/api-key')"
        ".read().strip(), c.state_dir)",
    )
    assert loaded.out.split() == [URL, ENV_ID, "True", "/var/lib/gpuhost-agent"], loaded.both
    # The key is in its file and nowhere else on disk.
    holders = scenario.run("grep", "-rlF", KEY, "/etc", "/opt", "/var", "/root", "/usr/local").out.split()
    assert holders == ["/etc/gpuhost-agent/api-key"], holders
    calls = scenario.calls()
    assert "apt-get install -y -qq --no-install-recommends docker-compose-plugin" in calls
    for call in (
        "systemctl daemon-reload",
        "systemctl enable gpuhost-agent.service",
        "systemctl restart --no-block gpuhost-agent.service",
    ):
        assert call in calls, (call, calls)
    assert "gpuhost-agent.service is running" in first.out

    # Second install, no arguments: upgrades in place, keeps state and the host's lines.
    scenario.sh(
        "echo 'GPUHOST_LOCATION=DE-Frankfurt' >>/etc/gpuhost-agent/agent.conf\n"
        "echo '# mine' >>/etc/gpuhost-agent/agent.conf\n"
        "echo stacks >/var/lib/gpuhost-agent/keep.json\n"
        "touch /opt/gpuhost-agent/venv/marker\n"
        "chmod 0644 /etc/gpuhost-agent/api-key\n"
        ": >/var/log/fake-calls.log"
    )
    second = scenario.install()
    assert second.code == 0, second.both
    assert "upgrading the agent in place" in second.out
    assert "keeping the state directory /var/lib/gpuhost-agent" in second.out
    text = scenario.read("/etc/gpuhost-agent/agent.conf")
    assert conf_values(text) == {**conf, "GPUHOST_LOCATION": "DE-Frankfurt"} and "# mine\n" in text
    assert scenario.read("/var/lib/gpuhost-agent/keep.json") == "stacks\n"
    files = scenario.files("/opt/gpuhost-agent/venv/marker", "/etc/gpuhost-agent/api-key")
    assert files["/opt/gpuhost-agent/venv/marker"] is not None, "the venv was recreated, not upgraded"
    assert files["/etc/gpuhost-agent/api-key"]["mode"] == "0o600"
    assert scenario.read("/etc/gpuhost-agent/api-key") == KEY + "\n"
    calls = scenario.calls()
    assert not [call for call in calls if call.startswith("apt-get install")], "Compose is there now"
    assert "systemctl restart --no-block gpuhost-agent.service" in calls

    # A new key from a file (kept out of ps): rotated, nothing else changes.
    scenario.sh("umask 077; echo envkey_rotated_2 >/root/new-key")
    third = scenario.install("--api-key-file", "/root/new-key")
    assert third.code == 0, third.both
    assert scenario.read("/etc/gpuhost-agent/api-key") == "envkey_rotated_2\n"
    assert "envkey_rotated_2" not in third.both
    assert conf_values(scenario.read("/etc/gpuhost-agent/agent.conf"))["GPUHOST_ENV_ID"] == ENV_ID

    # Uninstall: the agent goes (its CDI spec of the GPUs with it), configuration, state, containers and
    # Docker stay.
    scenario.sh(": >/var/log/fake-calls.log; echo 'kind: nvidia.com/gpu' >/etc/cdi/gpuhost-nvidia.yaml")
    removed = scenario.install("--uninstall")
    assert removed.code == 0, removed.both
    assert f"install.sh: {msg('Renters')}\n" in removed.out
    # The agent takes its own firewall rules away first (none here: the chroot has no iptables).
    assert "removing the agent's egress rules" in removed.out and "no egress rule" in removed.out, removed.both
    files = scenario.files(*INSTALLED, "/opt/gpuhost-agent", "/etc/cdi/gpuhost-nvidia.yaml")
    gone = (
        "/opt/gpuhost-agent",
        "/opt/gpuhost-agent/venv/bin/gpuhost-agent",
        "/usr/local/bin/gpuhost-agent",
        "/etc/systemd/system/gpuhost-agent.service",
        "/etc/systemd/system/docker.service.d/10-gpuhost-egress.conf",
        "/etc/cdi/gpuhost-nvidia.yaml",
        INSTALLED[-1],
    )
    assert all(files[path] is None for path in gone), files
    assert all(
        files[path] is not None
        for path in ("/etc/gpuhost-agent/agent.conf", "/etc/gpuhost-agent/api-key", "/var/lib/gpuhost-agent")
    ), files
    calls = scenario.calls()
    assert "systemctl disable --now gpuhost-agent.service" in calls and "systemctl daemon-reload" in calls
    assert not [call for call in calls if call.startswith("docker")], "uninstall must not touch Docker"

    again = scenario.install("--uninstall")
    assert again.code == 0 and "is not installed here" in again.out

    purged = scenario.install("--uninstall", "--purge")
    assert purged.code == 0, purged.both
    assert_not_installed(scenario)


@needs_root
def test_pinned_install_on_a_gpu_less_chroot_and_the_unit_verifies_as_installed(scenario: Scenario) -> None:
    add(scenario, "docker")
    # Compose is missing and apt fails to install it: not fatal, the agent bundles one.
    scenario.sh(
        "echo docker-compose-plugin >/etc/fake/apt-candidates\n"
        "printf '#!/bin/sh\\nexit 1\\n' >/etc/fake/apt-hooks/docker-compose-plugin\n"
        "chmod +x /etc/fake/apt-hooks/docker-compose-plugin"
    )
    args = ("--url", URL, "--env-id", ENV_ID, "--api-key", KEY, "--allow-no-gpu")

    missing = scenario.install(*args, "--version", "9.9.9")
    assert missing.code == 1
    assert "pip could not install gpuhost-agent==9.9.9" in missing.err

    result = scenario.install(*args, "--version", __version__, "--no-upgrades")
    assert result.code == 0, result.both
    assert f"source: gpuhost-agent=={__version__}" in result.out
    # The operator said no upgrades: the agent takes no offer, whatever its signature
    assert conf_values(scenario.read("/etc/gpuhost-agent/agent.conf"))["GPUHOST_UPGRADES"] == "off"
    refused = scenario.install(*args, "--release-key", "ed25519:not-a-key")
    assert refused.code == 2 and "--release-key must be" in refused.err, refused.both
    assert f"install.sh: warning: {allowed(msg('NVIDIA driver not found'))}\n" in result.err
    assert f"install.sh: warning: {msg('systemd is not running here')}\n" in result.err
    assert f"install.sh: warning: {msg('Docker Compose v2 is missing')}\n" in result.err
    assert "apt-get install -y -qq --no-install-recommends docker-compose-plugin" in scenario.calls()
    files = scenario.files("/etc/systemd/system/multi-user.target.wants/gpuhost-agent.service", INSTALLED[-1])
    assert files["/etc/systemd/system/multi-user.target.wants/gpuhost-agent.service"]["kind"] == "link"
    assert files[INSTALLED[-1]] is None, "Debian 12's systemd 252 has no RestartSteps="
    assert scenario.run("/opt/gpuhost-agent/venv/bin/gpuhost-agent", "version").out.strip() == __version__
    # The unit as installed, with its real ExecStart, by Debian 12's own systemd-analyze.
    verify = scenario.run("systemd-analyze", "verify", "/etc/systemd/system/gpuhost-agent.service")
    assert verify.code == 0 and not verify.both.strip(), verify.both


SWARM_KEY = "swarmkey_0123456789_do_not_print"


@needs_root
def test_a_swarm_worker_installs_with_the_environments_key_and_no_marketplace(scenario: Scenario) -> None:
    """The second machine of a Swarm environment (docs/swarm.md): no URL, id or
    API key; the environment's key in its own root-only file, never shown."""
    add(scenario, "docker", "compose", "nvidia", "toolkit")
    scenario.sh(f"printf '%s\\n' {SWARM_KEY} >/root/swarm.key; printf 'short\\n' >/root/short.key")
    for args, refusal in (
        (("--swarm", "worker"), "--swarm worker needs --swarm-key-file FILE"),
        (("--swarm", "worker", "--swarm-key-file", "/root/swarm.key"), "--swarm worker needs --swarm-tls-file FILE"),
        (("--swarm-worker-bundle", "/root/w.pem"), "--swarm-worker-bundle runs on the leader after its install"),
        (("--swarm", "boss", "--swarm-key-file", "/root/swarm.key"), "--swarm must be leader or worker"),
        (("--swarm", "worker", "--swarm-key-file", "/root/short.key"), "at least 16 printable characters"),
        (("--swarm", "leader", "--swarm-key-file", "/root/swarm.key"), "a first install needs --url"),
    ):
        refused = scenario.install(*args)
        assert refused.code == 2 and refusal in refused.err, (args, refused.both)
    assert_not_installed(scenario)

    with tempfile.TemporaryDirectory() as leader:  # the leader's install, elsewhere: its CA writes the bundle
        swarm_tls.install_leader(Path(leader))
        bundle = swarm_tls.bundle(Path(leader), "workernode000000000000002").decode()
    scenario.run("/bin/sh", "-ec", "umask 077; cat >/root/worker.pem", input=bundle)
    result = scenario.install("--swarm", "worker", "--swarm-key-file", "/root/swarm.key", "--swarm-tls-file", "/root/w")
    assert result.code == 2 and "cannot read the worker's TLS bundle" in result.err, result.both
    tls = ("--swarm-tls-file", "/root/worker.pem")
    result = scenario.install("--swarm", "worker", "--swarm-key-file", "/root/swarm.key", *tls)
    assert result.code == 0, result.both
    keys = scenario.files(*(f"/etc/gpuhost-agent/swarm-tls/{name}" for name in ("key.pem", "cert.pem", "ca.key")))
    assert keys["/etc/gpuhost-agent/swarm-tls/key.pem"]["mode"] == "0o600", keys
    assert keys["/etc/gpuhost-agent/swarm-tls/cert.pem"] and keys["/etc/gpuhost-agent/swarm-tls/ca.key"] is None
    assert SWARM_KEY not in result.both and "cannot reach the marketplace" not in result.both
    files = scenario.files("/etc/gpuhost-agent/swarm-key", "/etc/gpuhost-agent/api-key")
    assert files["/etc/gpuhost-agent/swarm-key"]["mode"] == "0o600" and files["/etc/gpuhost-agent/api-key"] is None
    assert scenario.read("/etc/gpuhost-agent/swarm-key") == SWARM_KEY + "\n"
    assert conf_values(scenario.read("/etc/gpuhost-agent/agent.conf")) == {
        "GPUHOST_SWARM": "worker",
        "GPUHOST_SWARM_KEY_FILE": "/etc/gpuhost-agent/swarm-key",
        "GPUHOST_STATE_DIR": "/var/lib/gpuhost-agent",
    }
    loaded = scenario.run(
        "/opt/gpuhost-agent/venv/bin/python",
        "-c",
        "from gpuhost_agent.service import config; c = config.load({});"
        "from gpuhost_agent.service import swarm_tls; swarm_tls.server_context(c.swarm_tls_dir);"
        "print(c.swarm, c.swarm_key == open('/etc/gpuhost-agent/swarm-key').read().strip(), c.marketplace_url)",
    )
    assert loaded.out.split() == ["worker", "True", "None"], loaded.both
    holders = scenario.run("grep", "-rlF", SWARM_KEY, "/etc", "/opt", "/var", "/usr/local").out.split()
    assert holders == ["/etc/gpuhost-agent/swarm-key"], holders
    again = scenario.install()  # an upgrade in place keeps the role and the key
    assert again.code == 0 and SWARM_KEY not in again.both, again.both
    assert conf_values(scenario.read("/etc/gpuhost-agent/agent.conf"))["GPUHOST_SWARM"] == "worker"
