"""Guards for values a client or the marketplace sent: JSON numbers that are not booleans, whole counts, text
any file or process can take, ids safe as directory names and labels."""

from __future__ import annotations

import re
from typing import TypeGuard


def is_number(value: object) -> TypeGuard[int | float]:
    """A JSON number: int or float, but not a boolean (which Python counts as int)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_whole(value: object, high: int | None = None) -> TypeGuard[int]:
    """A JSON whole number from 0 (to `high`), and not a boolean: counts and ids."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value and (high is None or value <= high)


def whole(value: object, high: int | None = None) -> int | None:
    """A count or id a client sent, as an int, or None if it is not one. A
    float with no fraction counts (JSON Schema's integer is the number's
    value, so 692.0 is an integer there); a boolean does not."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        value = int(value)
    return value if is_whole(value, high) else None


def is_text(value: str) -> bool:
    """Whether a received str is Unicode text any file or process can take."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# Ids become directory and label values on the host: no path separators, no dots first.
SAFE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def is_safe_id(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and bool(SAFE_ID.fullmatch(value))


def clipped(text: str, limit: int = 64) -> str:
    """A received string as it may appear in a message: short, and printable
    as UTF-8 (the marketplace could send anything, of any length)."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit] + "..."
