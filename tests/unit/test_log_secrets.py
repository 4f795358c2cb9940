"""Secrets never reach a log line or an error the agent passes on."""

from __future__ import annotations

import io
import json

from gpuhost_agent.common import logs
from gpuhost_agent.runtime.compose import clean_error


def test_secrets_never_reach_a_log_line():
    stream = io.StringIO()
    logs.configure("info", json_lines=True, stream=stream)
    logs.SECRETS.add("hunter2-secret-value")
    log = logs.get_logger("t")
    log.info(
        "deploy",
        error="compose said: invalid value hunter2-secret-value here",
        api_key="k-123456",
        environmentVariables={"A": "x"},
        nested={"token": "abc12345", "fine": "ok"},
    )
    line = json.loads(stream.getvalue())
    assert "hunter2-secret-value" not in stream.getvalue()
    assert line["error"] == "compose said: invalid value *** here"
    assert line["api_key"] == logs.MASK and line["environmentVariables"] == logs.MASK
    assert line["nested"] == {"token": logs.MASK, "fine": "ok"}
    logs.configure("warning", json_lines=True)


def test_compose_errors_lose_agent_paths(tmp_path):
    text = f"Container x  Creating\nfailed to parse {tmp_path}/compose.yaml: yaml: line 1: bad\n"
    assert clean_error(text, tmp_path) == "failed to parse compose.yaml: yaml: line 1: bad"


def test_secret_registry_counts_shared_values():
    registry = logs.SecretRegistry()
    registry.add_many(["shared-value", "only-a"])
    registry.add_many(["shared-value", "abc"])  # "abc" is too short to scrub
    assert "abc" not in registry and registry.scrub("x shared-value only-a") == "x *** ***"
    registry.discard_many(["shared-value", "only-a"])
    assert registry.scrub("shared-value only-a") == "*** only-a"
    registry.discard_many(["shared-value"])
    assert "shared-value" not in registry and registry.scrub("shared-value") == "shared-value"


def test_a_short_value_is_masked_everywhere_but_inside_an_id() -> None:
    """A renter's PORT=8000 once turned a container id in the status answer into
    64eb8***af1...: a short value inside a run of 12 or more hex digits (an id, a
    digest) is left alone; anywhere else it is masked, glued to letters or after an
    escape too (red team, 2026-11-29); a long one is masked wherever it appears."""
    from gpuhost_agent.common.visible import visible

    registry = logs.SecretRegistry()
    registry.add_many(["8000", "hunter22", "Hx72q", "admin", "beef"])
    container_id = "64eb88000af174883187ea3a3eb44d6bf719bf44b98d3d94c2463d07baecab9e"
    assert registry.scrub(f"container {container_id} sha256:{container_id}") == (
        f"container {container_id} sha256:{container_id}"
    )
    assert registry.scrub("bind 0.0.0.0:8000 failed; 8000/tcp") == "bind 0.0.0.0:*** failed; ***/tcp"
    assert registry.scrub("PORT_8000=1 x8000 abc8000def") == "PORT_***=1 x*** abc***def"  # runs under 12 digits
    assert registry.scrub("image repo/hunter22app:1") == "image repo/***app:1"
    for escaped in (repr("password:\nHx72q"), visible("pw:\tHx72q"), "account=admin%3AHx72q", "adminHx72q"):
        assert "Hx72q" not in registry.scrub(escaped) and "admin" not in registry.scrub(escaped), escaped
    assert registry.scrub("deadbeef00 beef") == "dead***00 ***"
