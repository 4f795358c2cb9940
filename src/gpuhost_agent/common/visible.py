"""Text from outside shown to a person: every character that would act on a
terminal instead of being read is written out visibly.

What the agent prints for a person (`gpuhost-agent status`, `doctor`,
`probe`, its log lines on a console) carries text that renters and their
containers chose: stack names, error messages quoting a Compose file or an
image, log fields. Printed raw, an ESC sequence can write the operator's
clipboard (OSC 52), retitle or clear the terminal; a carriage return or a
line feed can forge a line of the report; a bidi override can make text read
other than it is. Here every C0 control (tabs and line ends included), DEL,
every C1 control (U+0080-U+009F), the Unicode line and paragraph separators
and the bidi controls become their escape (`\\x1b`, `\\u202e`), so they are
seen, never obeyed. Other text, backslashes included, is left as it is.

Standard library only: `gpuhost-agent status` imports it.
"""

from __future__ import annotations

import re
from typing import Any

_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_ACTING = re.compile(f"[\x00-\x1f\x7f-\x9f\u2028\u2029{_BIDI}]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str) -> str:
    """`text` with every control, separator and bidi control escaped."""
    return _ACTING.sub(_escape, text)


def visible_tree(value: Any) -> Any:
    """A copy of decoded JSON (dicts, lists, strings, numbers) with every
    string, keys included, made visible: clean the data once, before any of
    it is placed in a line, and no field can be forgotten."""
    if isinstance(value, str):
        return visible(value)
    if isinstance(value, dict):
        return {visible_tree(key): visible_tree(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [visible_tree(item) for item in value]
    return value
