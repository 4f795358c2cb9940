"""The environment's installation line and the script it runs.

`GET /v1/environments/{envId}/script` answers, as the seed does, a string:
"an installation command line for the environment". A host pastes it on the
GPU machine:

     printf '%s\n' <key> | $(command -v sudo) bash -c '<download install.sh into a folder of
        root's own, run it>' install.sh <base>/install.sh --url <base> --env-id <envId>
        --release-key ed25519:<base64> --api-key-stdin

(one line). It carries the environment's own API key (that is its purpose: the
installer writes it to /etc/gpuhost-agent/api-key), so like every renter path it
needs the user key, and whoever holds the line holds the environment's key. The
key reaches install.sh on its standard input: printf is the shell's own command,
so no process's command line (`ps`, /proc/<pid>/cmdline) ever holds it, as it
did when the line passed `--api-key` to `sudo bash` for the whole install; and
the line starts with a space, which keeps it out of bash's history where
HISTCONTROL ignores such lines (Debian's and Ubuntu's default). It pins the
public key this marketplace signs its releases with (`--release-key`): the host
installs an offered release only when it verifies with that key.

`GET /v1/install.sh` serves the repository's install.sh. It must be public
(PUBLIC_PATHS: the application's auth middleware lets it through), because
curl sends no header; that is safe because the script holds no secret, the key
travels on install.sh's standard input. The script is found in the checkout
the agent runs from; an agent installed from a wheel has none, and says so.

`GET /v1/install/build.lock` and `/v1/install/agent.lock` serve the locks of
the release's dependencies (the checkout's requirements/), public as the
script is: install.sh run from the line, with no checkout, installs exactly
those versions and files (its --lock default, <url>/install).
"""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path

from aiohttp import web

from gpuhost_agent.local_marketplace.http_errors import json_error
from gpuhost_agent.local_marketplace.state import MarketplaceState

INSTALL_SCRIPT_PATH = "/v1/install.sh"
LOCKS = ("build.lock", "agent.lock")
LOCK_PATHS = {f"/v1/install/{name}": name for name in LOCKS}
# Paths the auth middleware must serve without an API key.
PUBLIC_PATHS = frozenset({INSTALL_SCRIPT_PATH, *LOCK_PATHS})


def checkout_install_script() -> Path | None:
    """install.sh at the root of the checkout this package runs from, if any."""
    candidate = Path(__file__).resolve().parents[3] / "install.sh"
    return candidate if candidate.is_file() else None


def _file_or_404(path: Path | None, what: str) -> web.Response:
    if path is None or not path.is_file():
        return json_error(
            404,
            f"{what} is not part of this installation of the agent; "
            "the local marketplace serves it when the agent runs from a checkout",
        )
    return web.Response(body=path.read_bytes(), content_type="text/plain", headers={"Cache-Control": "no-store"})


# What root runs: install.sh downloaded into a folder of root's own (mktemp -d:
# 0700), never one another user can write to (in /tmp another user could plant a
# checkout beside the script, which install.sh would install from, as root).
# The values come as arguments, so none is quoted twice; the key on stdin.
ROOT_STEPS = (
    'd=$(mktemp -d) && trap \'rm -rf "$d"\' EXIT && curl -fsSLo "$d/install.sh" "$1" && shift && '
    'bash "$d/install.sh" "$@"'
)


def install_line(base_url: str, env_id: str, api_key: str, release_key: str) -> str:
    """The command line a host pastes; every value shell-quoted where it needs it.
    The script is downloaded first, so its standard input is free for the key.
    sudo where there is one: a root shell on a host without sudo runs it as is
    (install.sh says so to anyone else)."""
    quote = shlex.quote
    return (
        f" printf '%s\\n' {quote(api_key)} | $(command -v sudo) bash -c {quote(ROOT_STEPS)} install.sh "
        f"{quote(base_url + '/install.sh')} --url {quote(base_url)} --env-id {quote(env_id)} "
        f"--release-key {quote(release_key)} --api-key-stdin"
    )


def reached_as(request: web.Request) -> str:
    """host[:port] the caller reached us on, so the line works from where it
    was asked. A Host header without a port (some clients and proxies drop a
    non-default one) gets the port the connection came in on: the line must
    never lose it."""
    host = request.host
    has_port = host.rsplit("]", 1)[-1].count(":") == 1  # "[::1]:8787", "h:8787"; not "[::1]" or "h"
    sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
    port = sockname[1] if isinstance(sockname, tuple) and len(sockname) >= 2 else None
    default = 443 if request.scheme == "https" else 80
    if not has_port and isinstance(port, int) and port != default:
        return f"{host}:{port}"
    return host


def routes(state: MarketplaceState, install_script: Path | None = None) -> list[web.RouteDef]:
    """install_script: the file to serve (default: the checkout's install.sh)."""
    script = install_script if install_script is not None else checkout_install_script()

    async def get_script(request: web.Request) -> web.Response:
        env_id = request.match_info["envId"]
        if env_id != state.store.envId:
            return json_error(404, f"environment {env_id} not found")
        base_url = f"{request.scheme}://{reached_as(request)}/v1"
        return web.json_response(install_line(base_url, env_id, state.store.envApiKey, state.release_public_key()))

    async def get_install_script(_request: web.Request) -> web.Response:
        answer = await asyncio.to_thread(_file_or_404, script, "install.sh")
        if answer.status == 200:
            answer.content_type = "text/x-shellscript"
        return answer

    locks = script.parent / "requirements" if script is not None else None

    async def get_lock(request: web.Request) -> web.Response:
        name = LOCK_PATHS[request.path]
        return await asyncio.to_thread(_file_or_404, locks / name if locks else None, name)

    return [
        web.get("/v1/environments/{envId}/script", get_script),
        web.get(INSTALL_SCRIPT_PATH, get_install_script),
        *(web.get(path, get_lock) for path in LOCK_PATHS),
    ]
