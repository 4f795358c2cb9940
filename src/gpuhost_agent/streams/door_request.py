"""A request to the worker's door (streams/node_proxy.py), read strictly and
rebuilt for the engine from checked values alone. Pure.

No byte of the client's head reaches the engine: dockerd's HTTP parser takes
a bare LF as a line end, so a value copied from a header could carry a whole
second request. So the head is refused unless every line ends in CRLF, holds
no other control character and is a plain `name: value`; and the engine's
request is written here: method, a path the route matched, a query of the
route's own parameters re-encoded, fixed headers, and the checked body.
"""

from __future__ import annotations

import re
import urllib.parse

from gpuhost_agent.streams.door_routes import Refused

_REQUEST_LINE = re.compile(r"(GET|POST) (/[\x21-\x7e]*) HTTP/1\.[01]")
_HEADER = re.compile(r"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([\x20-\x7e\t]*?)[ \t]*")
_ONCE = ("authorization", "content-length", "transfer-encoding", "host")
_VALUE = re.compile(r"[A-Za-z0-9._:+-]{0,64}")
QUERIES = {  # route -> the query parameters the engine is given (any other is dropped)
    "logs": ("stdout", "stderr", "timestamps", "follow", "tail", "since", "until"),
    "resize": ("h", "w"),
}


def parse_head(raw: bytes) -> tuple[str, str, dict[str, str]]:
    """(method, target, headers by lower-case name) of a head read up to its
    blank line; Refused(400) for anything but plain CRLF-ended lines."""
    text = raw.decode("latin-1")
    if not text.endswith("\r\n\r\n"):
        raise Refused(400, "the request's head does not end in a blank line")
    lines = text[:-4].split("\r\n")
    if any("\r" in line or "\n" in line for line in lines):
        raise Refused(400, "a bare CR or LF in the request's head")
    request = _REQUEST_LINE.fullmatch(lines[0])
    if request is None:
        raise Refused(400, "not a request line this door reads")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        header = _HEADER.fullmatch(line)
        if header is None:
            raise Refused(400, "a header line that is not a plain name and value")
        name = header.group(1).lower()
        if name in headers and name in _ONCE:
            raise Refused(400, f"the {name} header twice")
        headers[name] = header.group(2)
    return request.group(1), request.group(2), headers


def body_length(headers: dict[str, str], limit: int) -> int:
    if "transfer-encoding" in headers:
        raise Refused(411, "a body needs a Content-Length")
    text = headers.get("content-length", "0")
    if not text.isascii() or not text.isdigit():
        raise Refused(400, "a Content-Length that is not a number")
    if int(text) > limit:
        raise Refused(413, f"a body of at most {limit} bytes")
    return int(text)


def engine_target(kind: str, target: str) -> str:
    """The target as the engine gets it: the client's path (the route matched
    it whole) and the route's own query parameters, each once and plain."""
    path, _, query = target.partition("?")
    try:
        pairs = urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise Refused(400, "a query this door does not read") from None
    names = [name for name, _ in pairs]
    if len(set(names)) != len(names):
        raise Refused(400, "a query parameter given twice")
    kept = [(name, value) for name, value in pairs if name in QUERIES.get(kind, ())]
    if any(not _VALUE.fullmatch(value) for _, value in kept):
        raise Refused(400, "a query value this door does not pass on")
    return path + (f"?{urllib.parse.urlencode(kept)}" if kept else "")
