"""What reaches the Engine API's paths and queries from the engine's short
calls (runtime/engine/client.py) and its pull (runtime/image_pull.py): an image
reference comes from a renter's Compose file, so it reaches a path only when
it parses as one, and never as another endpoint's path."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from gpuhost_agent.runtime.engine.client import (
    EVENT_LINE_LIMIT,
    EngineError,
    checked_reference,
    demultiplexed,
    read_events,
)
from gpuhost_agent.runtime.image_pull import repository_and_tag

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    "reference, path",
    [
        ("busybox", "busybox"),
        ("127.0.0.1:5000/gpuhost-test/busybox:1", "127.0.0.1:5000/gpuhost-test/busybox:1"),
        (f"busybox@{DIGEST}", f"busybox%40{DIGEST}"),
        (DIGEST, DIGEST),  # an image id
    ],
)
def test_a_reference_reaches_the_path_as_the_docker_cli_sends_it(reference, path) -> None:
    assert checked_reference(reference) == path


@pytest.mark.parametrize(
    "reference",
    [
        "../containers/abc/json",
        "busybox/../../containers/abc",
        "a//b",
        "./busybox",
        "busybox?force=1",
        "busybox#x",
        "busy box",
        "busybox%2f..",
        "",
        "x" * 513,
    ],
)
def test_what_is_no_reference_never_reaches_a_path(reference) -> None:
    with pytest.raises(EngineError, match="not an image reference"):
        checked_reference(reference)


def test_a_log_without_a_tty_is_read_out_of_its_frames_and_a_tty_s_as_it_came() -> None:
    framed = b"\x01\0\0\0\0\0\0\x06hello\n" + b"\x02\0\0\0\0\0\0\x05oops\n"
    assert demultiplexed(framed) == b"hello\noops\n"
    assert demultiplexed(b"plain tty output\n") == b"plain tty output\n"
    assert demultiplexed(b"\x01\0\0\0\0\0\0\x09cut") == b"\x01\0\0\0\0\0\0\x09cut"  # not whole frames: as it came


@pytest.mark.parametrize(
    "reference, expected",
    [
        ("busybox", ("busybox", "latest")),
        ("busybox:1.36", ("busybox", "1.36")),
        ("127.0.0.1:5000/team/app", ("127.0.0.1:5000/team/app", "latest")),  # a registry's port is no tag
        ("127.0.0.1:5000/team/app:2", ("127.0.0.1:5000/team/app", "2")),
        (f"busybox@{DIGEST}", (f"busybox@{DIGEST}", "")),
    ],
)
def test_a_pull_asks_for_the_repository_and_tag_the_reference_names(reference, expected) -> None:
    assert repository_and_tag(reference) == expected


async def test_an_event_line_over_the_limit_is_skipped_and_the_stream_goes_on() -> None:
    """Every event carries its container's labels, which a renter writes: one
    renter's huge labels must not end the events of every other (the
    stream broke at each healthcheck probe of such a container)."""

    class Transport:
        def pause_reading(self, **_kwargs: object) -> None: ...
        def resume_reading(self, **_kwargs: object) -> None: ...

    content = aiohttp.StreamReader(Transport(), 64 * 1024, loop=asyncio.get_running_loop())  # type: ignore[arg-type]
    huge = b'{"Actor": {"Attributes": {"x": "' + b"A" * (3 * EVENT_LINE_LIMIT) + b'"}}}\n'
    for piece in (b'{"id": "before"}\n', huge[:100], huge[100:], b'{"id": "after"}\n', b'{"id": "la', b'st"}\n'):
        content.feed_data(piece)
    content.feed_eof()
    seen: list[dict] = []
    await read_events(content, seen.append)
    assert [event.get("id") for event in seen] == ["before", "after", "last"]
