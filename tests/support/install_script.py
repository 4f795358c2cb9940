"""install.sh and the messages it documents in its --help."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

INSTALL_SH = Path(__file__).resolve().parents[2] / "install.sh"


def help_text() -> str:
    return subprocess.run(["bash", str(INSTALL_SH), "--help"], capture_output=True, text=True, check=True).stdout


def documented_messages() -> list[str]:
    """The lines of --help's "Messages" section."""
    section = help_text().split("\nMessages", 1)[1].split("\n\n", 1)[0]
    return [line.strip() for line in section.splitlines()[1:] if line.strip()]


def msg(prefix: str) -> str:
    """The documented message that starts with prefix (exactly one)."""
    found = [line for line in documented_messages() if line.startswith(prefix)]
    assert len(found) == 1, (prefix, found)
    return found[0]


def script_constant(name: str) -> str:
    """The value of install.sh's `readonly NAME="..."` (a literal, or one without expansions)."""
    match = re.search(rf'^readonly {name}=("?)(.*?)\1$', INSTALL_SH.read_text(), flags=re.M)
    assert match, name
    return match.group(2)


def allowed(message: str) -> str:
    """A GPU message as the warning --allow-no-gpu makes of it: without the advice to pass it."""
    hint = script_constant("NO_GPU_HINT")
    assert message.endswith(hint), message
    return message.removesuffix(hint)


def too_old(prefix: str, found: str) -> str:
    """The documented "... VERSION is older than the required ..." message, for the version found."""
    return msg(prefix).replace("VERSION", found)
