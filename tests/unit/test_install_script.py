"""install.sh without a chroot: its --help documents every message it can print,
its options, shellcheck; the marketplace's installation line and the routes that
serve it. (install.sh on a fresh Debian 12 chroot: tests/integration/test_install.py.)
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from support.install_script import INSTALL_SH, allowed, documented_messages, msg, script_constant, too_old
from support.machine_samples import good_host

from gpuhost_agent.inventory import compliance
from gpuhost_agent.local_marketplace import script_api
from gpuhost_agent.local_marketplace.server import build_app
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.protocol import wire
from gpuhost_agent.protocol.requirements import INSTALL_SH_MINIMUMS, Requirements

ROOT = Path(__file__).resolve().parents[2]


def test_help_lists_every_message_the_script_can_print() -> None:
    script = INSTALL_SH.read_text()
    names = sorted(set(re.findall(r"\$(MSG_[A-Z_]+)", script)))
    defined = re.findall(r"^readonly (MSG_[A-Z_]+)=", script, flags=re.M)
    assert sorted(defined) == names, "every MSG_ used is defined, every one defined is used"
    assert len(documented_messages()) == len(defined), "--help lists each message once"
    for line in documented_messages():
        assert "$" not in line and "\\" not in line


def test_scripts_are_shellcheck_clean() -> None:
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed (optional: apt-get install shellcheck)")
    scripts = [
        INSTALL_SH,
        *sorted((ROOT / "scripts").glob("install-test-*.sh")),
        *sorted((ROOT / "scripts").glob("rootfs-*.sh")),
    ]
    result = subprocess.run(["shellcheck", *map(str, scripts)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_unknown_options_are_usage_errors() -> None:
    for args in (["--frobnicate"], ["--url"], ["--purge"]):
        result = subprocess.run(["bash", str(INSTALL_SH), *args], capture_output=True, text=True)
        assert result.returncode == 2, (args, result.stderr)
        assert "install.sh: error:" in result.stderr


# ---- the script routes on their own ------------------------------------------------------------


async def test_script_route_answers_the_installation_line(tmp_path: Path) -> None:
    store = Store.load_or_create(None)
    fake_script = tmp_path / "install.sh"
    await asyncio.to_thread(fake_script.write_text, "#!/bin/sh\necho hi\n")
    app = web.Application()
    app.add_routes(script_api.routes(MarketplaceState(store), install_script=fake_script))
    async with TestClient(TestServer(app)) as http:
        response = await http.get(f"/v1/environments/{store.envId}/script")
        assert response.status == 200
        line = await response.json()
        base = f"http://{response.url.host}:{response.url.port}/v1"
        assert line == script_api.install_line(
            base, store.envId, store.envApiKey, MarketplaceState(store).release_public_key()
        )
        words = shlex.split(line.split("| ", 1)[1])
        assert words[words.index("--url") + 1] == base and words[words.index("--env-id") + 1] == store.envId
        # the key its releases are signed with, pinned on the host
        assert words[words.index("--release-key") + 1] == MarketplaceState(store).release_public_key()
        assert f"{base}/install.sh" in words and store.envApiKey not in line.split("|", 1)[1]
        # A Host header without the port lost it from the line.
        for host in (str(response.url.host), f"{response.url.host}:{response.url.port}"):
            portless = await http.get(f"/v1/environments/{store.envId}/script", headers={"Host": host})
            assert f"--url {base} " in await portless.json(), host
        missing = await http.get("/v1/environments/nope/script")
        assert missing.status == 404 and (await missing.json())["status"] == 404
        script = await http.get("/v1/install.sh")
        assert script.status == 200 and script.content_type == "text/x-shellscript"
        assert await script.text() == await asyncio.to_thread(fake_script.read_text)


async def test_without_a_checkout_install_sh_is_not_served(tmp_path: Path) -> None:
    app = web.Application()
    app.add_routes(
        script_api.routes(MarketplaceState(Store.load_or_create(None)), install_script=tmp_path / "absent.sh")
    )
    async with TestClient(TestServer(app)) as http:
        response = await http.get("/v1/install.sh")
        assert response.status == 404
        assert "checkout" in (await response.json())["message"]
        response = await http.get("/v1/install/agent.lock")
        assert response.status == 404 and "agent.lock" in (await response.json())["message"]


def test_the_checkout_install_script_is_found() -> None:
    assert script_api.checkout_install_script() == INSTALL_SH


def test_the_line_gives_the_key_on_install_sh_stdin_and_on_no_command_line(tmp_path: Path) -> None:
    """The line run by bash, with curl and sudo stand-ins that log their argv: install.sh
    (a stand-in saying what it got) reads the key from its standard input, no program's
    arguments hold it, the downloaded script is removed, and the line stays out of a
    history that ignores lines starting with a space."""
    stand_ins = tmp_path / "bin"
    stand_ins.mkdir()
    log = tmp_path / "argv.log"
    (stand_ins / "curl").write_text(
        f'#!/bin/bash\necho "curl $*" >>{log}\nwhile [ "$1" != -fsSLo ]; do shift; done\n'
        'printf \'%s\\n\' \'IFS= read -r key; echo "args: $*"; echo "key: $key"; echo "at: $0"\' >"$2"\n'
    )
    (stand_ins / "sudo").write_text(f'#!/bin/bash\necho "sudo $*" >>{log}\nexec "$@"\n')
    for tool in stand_ins.iterdir():
        tool.chmod(0o755)
    key = "env_k'ey$(touch /tmp/pwned)"
    line = script_api.install_line("http://h:1/v1", "env 1", key, "ed25519:AAAA")
    assert line.startswith(" printf ")
    done = subprocess.run(
        ["bash", "-c", line], capture_output=True, text=True, env={"PATH": f"{stand_ins}:/usr/bin:/bin"}, check=True
    )
    said = dict(entry.split(": ", 1) for entry in done.stdout.splitlines())
    assert said["key"] == key
    assert said["args"] == "--url http://h:1/v1 --env-id env 1 --release-key ed25519:AAAA --api-key-stdin"
    assert not Path(said["at"]).exists(), "the downloaded script is removed"
    assert key not in log.read_text() and "install.sh" in log.read_text()
    assert "sudo bash -c" in log.read_text()

    # A root shell on a host without sudo (the line once said sudo to root): it runs as is.
    bare = tmp_path / "bare"
    bare.mkdir()
    for tool in ("bash", "mktemp", "rm", "cat"):
        (bare / tool).symlink_to(shutil.which(tool) or f"/bin/{tool}")
    (bare / "curl").symlink_to(stand_ins / "curl")
    done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, env={"PATH": str(bare)}, check=True)
    assert dict(entry.split(": ", 1) for entry in done.stdout.splitlines())["key"] == key


async def test_in_the_app_the_line_needs_the_user_key_and_install_sh_needs_none() -> None:
    """NEEDS script_api wired into server.build_app (routes + the public-path exception)."""
    store = Store.load_or_create(None)
    async with TestClient(TestServer(build_app(MarketplaceState(store)))) as http:
        path = f"/v1/environments/{store.envId}/script"
        assert (await http.get(path)).status == 401
        assert (await http.get(path, headers={wire.API_KEY_HEADER: store.envApiKey})).status == 401
        assert (await http.get(path, headers={wire.API_KEY_HEADER: store.renterApiKey})).status == 200
        script = await http.get("/v1/install.sh")
        assert script.status == 200
        assert await script.text() == await asyncio.to_thread(INSTALL_SH.read_text)
        # Only that exact path is public.
        assert (await http.get("/v1/install.sh/x")).status == 401
        # ...and the locks its --lock default reads, the checkout's requirements/
        for name in ("build.lock", "agent.lock"):
            lock = await http.get(f"/v1/install/{name}")
            assert lock.status == 200, name
            assert await lock.text() == await asyncio.to_thread((INSTALL_SH.parent / "requirements" / name).read_text)
        assert (await http.get("/v1/install/dev.lock")).status == 401


# ---- one list of minimums, one wording ------------------------------------------------------


def test_install_sh_checks_the_minimums_doctor_judges_by() -> None:
    copies = {name: script_constant(name) for name in INSTALL_SH_MINIMUMS}
    assert copies == {name: getattr(Requirements(), field) for name, field in INSTALL_SH_MINIMUMS.items()}
    versions = {spec.name for spec in dataclasses.fields(Requirements) if spec.type == "str"}
    assert set(INSTALL_SH_MINIMUMS.values()) == versions, "a new version minimum belongs in install.sh too"


# (install.sh message prefix, doctor's check, the probe's field, a version below the minimum)
SHORTFALLS = [
    ("NVIDIA driver VERSION", "driver-version", ("nvml", "driverVersion"), "470.239.06"),
    ("the driver's CUDA VERSION", "cuda-version", ("nvml", "cudaDriverVersion"), "11.4"),
    ("NVIDIA Container Toolkit VERSION", "container-toolkit", ("host", "nvidiaContainerToolkit", "version"), "1.16.2"),
    ("Docker Engine VERSION", "docker", ("host", "docker", "version"), "20.10.24+dfsg1"),
    ("Docker Compose VERSION", "compose", ("host", "compose", "version"), "2.12.2"),
]


@pytest.mark.parametrize("prefix, check_id, field, found", SHORTFALLS, ids=[row[1] for row in SHORTFALLS])
def test_install_sh_says_what_doctor_says_of_an_old_version(prefix, check_id, field, found) -> None:
    probe = copy.deepcopy(good_host())
    *parents, last = field
    node = probe
    for key in parents:
        node = node[key]
    node[last] = found
    (failed,) = [check for check in compliance.evaluate(probe, Requirements()) if not check.ok]
    assert failed.id == check_id
    assert too_old(prefix, found).startswith(failed.summary + ": "), (too_old(prefix, found), failed.summary)


def _script_functions(body: str) -> subprocess.CompletedProcess:
    """install.sh's definitions (everything but its last line, `main "$@"`), then body."""
    program = f'source <(sed "$ d" {shlex.quote(str(INSTALL_SH))})\n{body}'
    return subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True)


def test_old_versions_warn_and_allow_no_gpu_drops_its_own_advice() -> None:
    shown = _script_functions(
        'too_old 20.10.24+dfsg1 "$MIN_DOCKER" "$MSG_DOCKER_OLD"\n'
        'too_old 27.3.1 "$MIN_DOCKER" "$MSG_DOCKER_OLD"\n'
        'too_old "" "$MIN_DOCKER" "$MSG_DOCKER_OLD"\n'
        'too_old 2.5.0 "$MIN_COMPOSE" "$MSG_COMPOSE_OLD"\n'
        'ALLOW_NO_GPU=1; need_gpu_piece "$MSG_DRIVER"; need_gpu_piece "$MSG_TOOLKIT"\n'
        'ALLOW_NO_GPU=0; need_gpu_piece "$MSG_DRIVER_BROKEN"\n'
        'printf "warning: %s\\n" "${WARNINGS[@]}"; printf "error: %s\\n" "${ERRORS[@]}"\n'
    ).stdout.splitlines()
    assert shown == [
        f"warning: {too_old('Docker Engine VERSION', '20.10.24+dfsg1')}",
        f"warning: {too_old('Docker Compose VERSION', '2.5.0')}",  # 2.5 < 2.20: compared as versions
        f"warning: {allowed(msg('NVIDIA driver not found'))}",
        f"warning: {allowed(msg('NVIDIA Container Toolkit not found'))}",
        f"error: {msg('nvidia-smi is installed but fails')}",
    ]
    assert "--allow-no-gpu" not in "".join(shown[2:4]) and shown[4].endswith("rerun with --allow-no-gpu")


def test_a_lock_with_anything_but_pinned_hashed_packages_is_refused(tmp_path: Path) -> None:
    """A lock is pins and hashes: a line pip would take as an option (another index, a
    folder of wheels) is named, and install.sh stops before pip runs."""
    function = subprocess.run(
        ["sed", "-n", "/^lock_problem() {/,/^}/p", str(INSTALL_SH)], capture_output=True, text=True, check=True
    ).stdout
    hostile = tmp_path / "agent.lock"
    hostile.write_text("--find-links /tmp/evil\nevil==1.0 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    for lock, expected in [(INSTALL_SH.parent / "requirements" / name, "") for name in ("agent.lock", "build.lock")] + [
        (hostile, "1:--find-links /tmp/evil")
    ]:
        said = subprocess.run(["bash", "-c", function + f'\nlock_problem "{lock}"'], capture_output=True, text=True)
        assert said.stdout.strip() == expected, (lock, said.stdout, said.stderr)


def test_a_machine_of_many_gpus_and_a_long_library_cache_is_read_whole(tmp_path: Path) -> None:
    """Under pipefail, a reader that stops early (head -n1, grep -q) cut the writer with
    SIGPIPE: install.sh then exited 141 with no word on a machine of several GPUs, or took
    a present NVML for a missing driver when ldconfig's list was long (a CI failure)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # More lines than a pipe holds (64 KiB) make the cut certain; a few GPUs made it a race.
    gpus = "".join(f"NVIDIA H100 80GB HBM3 number {index:04d}, 550.54.15\\n" for index in range(2000))
    (bin_dir / "nvidia-smi").write_text(
        "#!/bin/bash\n"
        'if [ "$#" -gt 0 ]; then printf "%b" ' + shlex.quote(gpus) + "; exit 0; fi\n"
        "echo '| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4 |'\n"
    )
    (bin_dir / "ldconfig").write_text(
        "#!/bin/bash\necho '\tlibnvidia-ml.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1'\n"
        'for i in $(seq 20000); do echo "\tlibfiller$i.so.1 (libc6,x86-64) => /usr/lib/libfiller$i.so.1"; done\n'
    )
    (bin_dir / "nvidia-ctk").write_text("#!/bin/bash\necho 'NVIDIA Container Toolkit CLI version 1.17.8'\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    body = (
        f"PATH={shlex.quote(str(bin_dir))}:$PATH\n"
        "set -euo pipefail\n"
        "check_nvidia\n"
        'printf "note: %s\\n" "${NOTES[@]}"; printf "error: %s\\n" "${ERRORS[@]}"\n'
    )
    shown = _script_functions(body).stdout.splitlines()
    assert shown[0] == "note: NVIDIA: 2000 GPU(s), NVIDIA H100 80GB HBM3 number 0000, 550.54.15", shown
    assert shown[1:] == ["note: NVIDIA Container Toolkit: 1.17.8", "error: "], shown


def test_a_checkout_in_a_folder_anyone_may_write_to_is_none(tmp_path: Path) -> None:
    """install.sh run from /tmp (the first form of the new install line downloaded it
    there) took a `checkout` anyone could plant beside it and installed it, as root.
    A folder writable by all, or sticky as /tmp, holds none."""
    for mode, found in ((0o755, True), (0o775, True), (0o777, False), (0o1777, False)):
        folder = tmp_path / f"mode-{mode:o}"
        (folder / "src" / "gpuhost_agent").mkdir(parents=True)
        (folder / "pyproject.toml").write_text('[project]\nname = "gpuhost-agent"\n')
        (folder / "install.sh").write_text(INSTALL_SH.read_text().rsplit("\n", 2)[0] + "\n")  # all but `main "$@"`
        folder.chmod(mode)
        program = f"source {shlex.quote(str(folder / 'install.sh'))}\nfind_checkout"
        said = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True).stdout.strip()
        assert said == (str(folder) if found else ""), (oct(mode), said)


def test_a_marketplace_url_in_clear_is_only_for_this_machine() -> None:
    """The API key goes with every request, so --url is https:// unless
    the marketplace is this machine; as the agent's own setting says (service/settings.py)."""
    for url, refused in (
        ("http://market.example/v1", True),
        ("http://10.0.0.5:8787/v1", True),
        ("http://127.0.0.1.evil.example/v1", True),
        # curl sends these to evil.example, with the key in clear
        ("http://evil.example?@127.0.0.1/v1", True),
        ("http://evil.example#@127.0.0.1/v1", True),
        ("http://user@127.0.0.1:8787/v1", False),
        ("https://market.example/v1", False),
        ("http://127.0.0.1:8787/v1", False),
        ("http://[::1]:8787/v1", False),
    ):
        body = f"URL={shlex.quote(url)} ENV_ID=env-1 API_KEY=k SOURCE=gpuhost-agent\nresolve_settings\necho resolved"
        program = f'source <(sed "$ d" {shlex.quote(str(INSTALL_SH))})\n{body}'
        done = subprocess.run(["bash", "-c", program], capture_output=True, text=True)
        if refused:
            assert done.returncode == 2 and "--url must be https://" in done.stderr, (url, done.stderr)
        else:
            assert done.returncode == 0 and "resolved" in done.stdout, (url, done.stderr)


def test_dockerd_is_pointed_at_the_pull_guard_and_its_own_proxy_becomes_the_upstream(tmp_path: Path) -> None:
    """install.sh writes Docker's drop-in for the pull guard at the address
    the agent reads, keeps a proxy dockerd had as the guard's upstream, says that Docker must
    restart, and says that a proxy in daemon.json would win over the drop-in."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text('#!/bin/sh\ncat "$DOCKER_PROXY_FILE"\n')
    docker.chmod(0o755)
    dropin, conf, daemon_json, proxy_file = (tmp_path / n for n in ("guard.conf", "agent.conf", "daemon.json", "px"))
    paths = {"GUARD_DROPIN": dropin, "CONF": conf, "DOCKER_DAEMON_JSON": daemon_json}
    moved = " ".join(f"-e {shlex.quote(f's|^readonly {name}=.*|{name}={value}|')}" for name, value in paths.items())

    def run(proxy: str, conf_text: str, daemon: str = "{}") -> subprocess.CompletedProcess:
        proxy_file.write_text(proxy + "\n")
        conf.write_text(conf_text)
        daemon_json.write_text(daemon)
        program = f"source <(sed {moved} -e '$ d' {shlex.quote(str(INSTALL_SH))})\nDRY_RUN=0\npull_guard"
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "DOCKER_PROXY_FILE": str(proxy_file)}
        return subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True, env=env)

    done = run("", "")
    assert (
        'Environment="HTTP_PROXY=http://127.0.0.1:47128" "HTTPS_PROXY=http://127.0.0.1:47128" "NO_PROXY=localhost"'
        in dropin.read_text()
    )
    assert "systemctl restart docker" in done.stdout and "UPSTREAM" not in conf.read_text()
    done = run("http://proxy.corp:3128", "GPUHOST_PULL_GUARD=127.0.0.1:5555\n")
    assert "HTTPS_PROXY=http://127.0.0.1:5555" in dropin.read_text()
    assert "GPUHOST_PULL_GUARD_UPSTREAM=http://proxy.corp:3128" in conf.read_text()
    done = run("http://127.0.0.1:47128", "", '{"proxies": {"https-proxy": "http://proxy.corp:3128"}}')
    assert "systemctl restart docker" not in done.stdout  # dockerd already pulls through it
    assert "Set its http-proxy and https-proxy to the guard's address" in done.stderr, done.stderr
    run("", "GPUHOST_PULL_GUARD=off\n")
    assert not dropin.exists()
