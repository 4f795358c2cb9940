"""`gpuhost-agent status`: ask the running agent over its status socket.

Readable for people by default, the endpoint's JSON with --json. Exit status:
0 running, 3 not running (no socket, or nobody answers on it), 4 not allowed
to open the socket (it is root's), 1 anything else.

With no state directory or socket named, and no agent on the default socket
(the system service's), it reads the development agent's, that of `make run`
(the Makefile gives it `state/` in the checkout: in the current directory, or
in the checkout this code runs from), and says on stderr which socket it read:
an operator's first look at `make run` finds the agent it started.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from gpuhost_agent.common.unix_http import UnixHTTPConnection
from gpuhost_agent.errors import OutsideFailure
from gpuhost_agent.service.config import ROOT_STATE_DIR
from gpuhost_agent.service.status.render import render

EXIT_OK, EXIT_ERROR, EXIT_NOT_RUNNING, EXIT_DENIED = 0, 1, 3, 4
# Where the system service's socket is: a non-root user's default state directory is
# elsewhere, so "not running" there may just mean "that one is root's".
SYSTEM_SOCKET = ROOT_STATE_DIR / "agent.sock"


class StatusUnavailable(OutsideFailure):
    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def fetch(socket_path: Path | str, path: str = "/status", timeout: float = 10.0) -> tuple[int, bytes]:
    """GET path over the socket; raises StatusUnavailable with the message and exit code to use."""
    socket_path = str(socket_path)
    connection = UnixHTTPConnection(socket_path, timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError):
        raise StatusUnavailable(
            f"gpuhost-agent is not running (no status socket at {socket_path})", EXIT_NOT_RUNNING
        ) from None
    except PermissionError:
        raise StatusUnavailable(
            f"permission denied on {socket_path}: the status socket is root's; run `sudo gpuhost-agent status`",
            EXIT_DENIED,
        ) from None
    except (OSError, http.client.HTTPException) as exc:
        raise StatusUnavailable(f"cannot read the agent's status from {socket_path}: {exc}", EXIT_ERROR) from None
    finally:
        connection.close()


def fetch_json(socket_path: Path | str, path: str, timeout: float = 10.0) -> Any:
    """GET path over the socket, its JSON answer; StatusUnavailable otherwise."""
    code, body = fetch(socket_path, path, timeout)
    if code != 200:
        raise StatusUnavailable(f"the agent answered {code} on {socket_path}", EXIT_ERROR)
    try:
        return json.loads(body)
    except ValueError:
        raise StatusUnavailable(f"the agent's {path} on {socket_path} is not JSON", EXIT_ERROR) from None


def fetch_status(socket_path: Path | str, timeout: float = 10.0) -> dict:
    return fetch_json(socket_path, "/status", timeout)


def _system_socket_is_roots(asked: Path, system: Path | None = None) -> bool:
    system = system or SYSTEM_SOCKET
    if os.geteuid() == 0 or asked == system:
        return False
    try:
        system.lstat()
    except PermissionError:
        return True
    except OSError:
        return False
    return False


DEVELOPMENT_STATE = "state"  # `make run`'s --state-dir, in the checkout
CHECKOUT = Path(__file__).resolve().parents[4]  # src/gpuhost_agent/service/status/ -> the checkout, when run from one


def development_sockets(cwd: Path | None = None, checkout: Path = CHECKOUT) -> list[Path]:
    """Where `make run`'s agent listens: state/agent.sock in the current
    directory, and in the checkout of this code (an editable install or
    PYTHONPATH=src), each once."""
    places = [cwd or Path.cwd()]
    if (checkout / "Makefile").is_file() and (checkout / "src" / "gpuhost_agent").is_dir():
        places.append(checkout)
    found: list[Path] = []
    for place in places:
        candidate = (place / DEVELOPMENT_STATE / "agent.sock").absolute()
        if candidate not in found:
            found.append(candidate)
    return found


def _fallback(asked: Path, fallbacks: Sequence[Path | str]) -> tuple[Path, dict] | StatusUnavailable | None:
    """The first development socket that answers, or the refusal of one that
    is there but not ours to read (root's), or None."""
    for candidate in map(Path, fallbacks):
        if candidate == asked or not candidate.exists():
            continue
        try:
            return candidate, fetch_status(candidate)
        except StatusUnavailable as exc:
            if exc.exit_code != EXIT_NOT_RUNNING:
                return exc
    return None


def run(
    socket_path: Path | str,
    as_json: bool = False,
    *,
    fallbacks: Sequence[Path | str] = (),
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """The `status` command; returns the exit status. `fallbacks`: the sockets
    to read when none answers at socket_path (the development agent's)."""
    out, err = out or sys.stdout, err or sys.stderr
    try:
        try:
            status = fetch_status(socket_path)
        except StatusUnavailable as exc:
            found = _fallback(Path(socket_path), fallbacks) if exc.exit_code == EXIT_NOT_RUNNING else None
            if found is None:
                raise
            if isinstance(found, StatusUnavailable):
                raise found from None
            read, status = found
            print(
                f"gpuhost-agent: no agent at {socket_path}; this is the development agent at {read}"
                f" (make run's state directory; --state-dir or --socket names another)",
                file=err,
            )
    except StatusUnavailable as exc:
        if exc.exit_code == EXIT_NOT_RUNNING and _system_socket_is_roots(Path(socket_path)):
            exc = StatusUnavailable(
                f"no status socket at {socket_path}, and the system agent's socket"
                f" {SYSTEM_SOCKET} is root's: run `sudo gpuhost-agent status`",
                EXIT_DENIED,
            )
        elif exc.exit_code == EXIT_NOT_RUNNING and fallbacks:
            looked = ", ".join(str(path) for path in fallbacks)
            exc = StatusUnavailable(f"{exc}, nor a development agent's (make run) at {looked}", EXIT_NOT_RUNNING)
        print(f"gpuhost-agent: {exc}" if exc.exit_code != EXIT_NOT_RUNNING else str(exc), file=err)
        return exc.exit_code
    if as_json:
        out.write(json.dumps(status, indent=2, sort_keys=True) + "\n")
    else:
        out.write(render(status))
    return EXIT_OK
