"""Text from renters and containers shown to a person:
every control character, C1 control, line or paragraph separator and bidi
control is written as its escape, in `status` and in log lines on a console.
The real command on a real stack: tests/integration/test_status_escape_engine.py."""

from __future__ import annotations

import io

from gpuhost_agent.common import logs
from gpuhost_agent.common.visible import visible, visible_tree
from gpuhost_agent.service.status import cli as status_cli

ACTING = [chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))]
ACTING += ["\u2028", "\u2029", "\u061c", "\u200e", "\u200f", *map(chr, range(0x202A, 0x202F))]
ACTING += [chr(c) for c in range(0x2066, 0x206A)]
HOSTILE = "ok\x1b]52;c;cm0gLXJmIC8K\x07\r[FAKE] line\n\u202egnp.exe\x9b2J\x85"


def test_every_acting_character_is_escaped_and_the_rest_kept() -> None:
    for char in ACTING:
        shown = visible(f"a{char}b")
        assert shown.startswith("a\\") and shown.endswith("b") and char not in shown, (char, shown)
    assert visible("\x1b") == "\\x1b" and visible("\u202e") == "\\u202e" and visible("\x9b") == "\\x9b"
    kept = "Grüße, 日本, C:\\path, tab-free text, emoji 🙂"
    assert visible(kept) == kept
    assert visible_tree({"k\n": ["a\rb", 3, None, {"x": "\x07"}]}) == {"k\\x0a": ["a\\x0db", 3, None, {"x": "\\x07"}]}


def test_status_text_shows_every_field_escaped() -> None:
    status = {
        "marketplace": HOSTILE,
        "envId": HOSTILE,
        "initState": {"state": "failed", "error": HOSTILE},
        "lastError": {"at": HOSTILE, "level": "warning", "event": HOSTILE, "error": HOSTILE, "hint": HOSTILE},
        "streams": {"open": {HOSTILE: 1}},
        "jobs": {"outcomes": {HOSTILE: 2}},
        "compliance": {"isCompliant": False, "checks": [{"id": HOSTILE, "ok": False, "summary": HOSTILE}]},
        "stacks": [
            {
                "stackId": HOSTILE,
                "name": HOSTILE,
                "rentalId": HOSTILE,
                "status": HOSTILE,
                "errorMsg": HOSTILE,
                "tunnels": [{"service": HOSTILE, "container": HOSTILE, "port": 1, "logins": [HOSTILE]}],
            }
        ],
    }
    text = status_cli.render(status)
    assert not [c for c in ACTING if c in text.replace("\n", "")]
    assert not [line for line in text.splitlines() if "[FAKE]" in line and not line.startswith(" ")]
    assert text.count("ok\\x1b]52;c;cm0gLXJmIC8K\\x07\\x0d[FAKE] line\\x0a\\u202egnp.exe\\x9b2J\\x85") >= 12


def test_json_status_escapes_every_control_character(monkeypatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(status_cli, "fetch_status", lambda _path: {"name": HOSTILE + "\x7f"})
    assert status_cli.run("/nonexistent", True, out=out) == 0
    assert not [c for c in ACTING if c in out.getvalue().replace("\n", "")]


def test_console_log_lines_show_fields_escaped() -> None:
    stream = io.StringIO()
    logs.configure("info", json_lines=False, stream=stream, journal=False)
    try:
        logs.get_logger("test").warning(HOSTILE, error=HOSTILE, name="plain\x1b[2J", **{HOSTILE: "key"})
    finally:
        logs.configure("warning")
    line = stream.getvalue()
    assert line.count("\n") == 1 and not [c for c in ACTING if c in line.rstrip("\n")], repr(line)
    assert "ok\\x1b]52;c;cm0gLXJmIC8K\\x07" in line and "plain\\x1b[2J" in line
