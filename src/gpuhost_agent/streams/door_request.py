"""A request to the worker's door (streams/door.py), read strictly and
rebuilt for the engine from checked values alone. Pure.

No byte of the client's head reaches the engine: dockerd's HTTP parser takes
a bare LF as a line end, so a value copied from a header could carry a whole
second request. So the head is refused unless every line ends in CRLF, holds
no other control character and is a plain `name: value`; and the engine's
request is written here: method, a path the route matched, a query of the
route's own parameters re-encoded, fixed headers, and a body written again
from the fields an exec may have. The body is read as the engine's Go JSON
decoder reads it, whose keys match a field in any case (`privileged` is
`Privileged`) and whose later duplicate wins: a key in no case of an allowed
field, a key given twice in any case, or a value of the wrong type is
refused, so the engine can only see what was checked.
"""

from __future__ import annotations

import json
import re
import urllib.parse

from gpuhost_agent.streams.door_routes import DoorRefused

_REQUEST_LINE = re.compile(r"(GET|POST) (/[\x21-\x7e]*) HTTP/1\.[01]")
_HEADER = re.compile(r"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([\x20-\x7e\t]*?)[ \t]*")
_ONCE = ("authorization", "content-length", "transfer-encoding", "host")
_VALUE = re.compile(r"[A-Za-z0-9._:+-]{0,64}")
QUERIES = {  # route -> the query parameters the engine is given (any other is dropped)
    "logs": ("stdout", "stderr", "timestamps", "follow", "tail", "since", "until"),
    "resize": ("h", "w"),
}

EXEC_FIELDS = {  # an exec's create: field -> its type; Privileged is refused when true, dropped when false
    "AttachStdin": bool,
    "AttachStdout": bool,
    "AttachStderr": bool,
    "Tty": bool,
    "Cmd": list,
    "Env": list,
}
START_FIELDS = {"Detach": bool, "Tty": bool}  # an exec's start


def parse_head(raw: bytes) -> tuple[str, str, dict[str, str]]:
    """(method, target, headers by lower-case name) of a head read up to its
    blank line; DoorRefused(400) for anything but plain CRLF-ended lines."""
    text = raw.decode("latin-1")
    if not text.endswith("\r\n\r\n"):
        raise DoorRefused(400, "the request's head does not end in a blank line")
    lines = text[:-4].split("\r\n")
    if any("\r" in line or "\n" in line for line in lines):
        raise DoorRefused(400, "a bare CR or LF in the request's head")
    request = _REQUEST_LINE.fullmatch(lines[0])
    if request is None:
        raise DoorRefused(400, "not a request line this door reads")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        header = _HEADER.fullmatch(line)
        if header is None:
            raise DoorRefused(400, "a header line that is not a plain name and value")
        name = header.group(1).lower()
        if name in headers and name in _ONCE:
            raise DoorRefused(400, f"the {name} header twice")
        headers[name] = header.group(2)
    return request.group(1), request.group(2), headers


def body_length(headers: dict[str, str], limit: int) -> int:
    if "transfer-encoding" in headers:
        raise DoorRefused(411, "a body needs a Content-Length")
    text = headers.get("content-length", "0")
    if not text.isascii() or not text.isdigit():
        raise DoorRefused(400, "a Content-Length that is not a number")
    if int(text) > limit:
        raise DoorRefused(413, f"a body of at most {limit} bytes")
    return int(text)


def engine_target(kind: str, target: str) -> str:
    """The target as the engine gets it: the client's path (the route matched
    it whole) and the route's own query parameters, each once and plain."""
    path, _, query = target.partition("?")
    try:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise DoorRefused(400, "a query this door does not read") from None
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        raise DoorRefused(400, "a query parameter given twice")
    kept = [(name, value) for name, value in pairs if name in QUERIES.get(kind, ())]
    if any(not _VALUE.fullmatch(value) for _, value in kept):
        raise DoorRefused(400, "a query value this door does not pass on")
    return path + (f"?{urllib.parse.urlencode(kept)}" if kept else "")


def engine_body(kind: str, body: bytes) -> bytes:
    """The body the engine gets: for an exec's create or start, the allowed
    fields of the client's body written again; for anything else, none."""
    fields = EXEC_FIELDS if kind == "create" else START_FIELDS if kind == "start" else None
    if fields is None:
        return b""
    try:
        asked = json.loads(body or b"{}", object_pairs_hook=_pairs)
    except ValueError as exc:
        raise DoorRefused(400, f"the body is not JSON the engine reads alike: {exc}"[:300]) from None
    if not isinstance(asked, _Pairs):
        raise DoorRefused(400, "the body is not a JSON object")
    by_fold = {name.lower(): name for name in fields}
    kept: dict[str, object] = {}
    for key, value in asked.items:
        if kind == "create" and key.lower() == "privileged":
            if value is not False:
                raise DoorRefused(403, "an exec is never privileged")
            continue
        name = by_fold.get(key.lower()) if key.isascii() else None
        if name is None:
            raise DoorRefused(400, f"{key[:40]!r} is not a field this door passes on")
        if not _typed(value, fields[name]):
            raise DoorRefused(400, f"{name} of the wrong type")
        kept[name] = value
    return json.dumps(kept).encode()


class _Pairs:
    """A JSON object as its key-value pairs; a key twice in any case is refused
    (Go keeps the last, Python's dict too, but a check may have read the first)."""

    def __init__(self, items: list[tuple[str, object]]):
        folded = [key.lower() for key, _ in items]
        if len(set(folded)) != len(folded):
            raise ValueError("a key given twice")
        self.items = items


def _pairs(items: list[tuple[str, object]]) -> _Pairs:
    return _Pairs(items)


def _typed(value: object, kind: type) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    return isinstance(value, list) and all(isinstance(item, str) for item in value)
