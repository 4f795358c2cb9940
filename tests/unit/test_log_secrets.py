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
    escape too; a long one is masked wherever it appears."""
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


# ---- a renter's values never rewrite the host's journal ------------------------------------------


def test_only_values_that_can_be_secrets_are_registered() -> None:
    assert not logs.might_be_secret("LOG_LEVEL", "warning") and not logs.might_be_secret("YEAR", "2026")
    assert not logs.might_be_secret("PORT", "8000") and not logs.might_be_secret("API_KEY", "abc")
    assert logs.might_be_secret("HF_TOKEN", "hf_x") and logs.might_be_secret("DB_PASSWORD", "Hx72q")
    assert logs.might_be_secret("MODEL", "llama-3-70b")  # eight characters and more: anything may be a secret


def test_a_renters_values_change_neither_a_lines_level_nor_its_event_time_or_ids() -> None:
    """With "error", "warning" and "2026" masked everywhere, error lines went to the journal at
    info priority, their event, ids and year masked, and `status`'s last error stopped updating."""
    stream = io.StringIO()
    logs.configure("info", json_lines=True, stream=stream, journal=True)
    rental, stack = "rental-2026-error", "stack-warning-1"
    try:
        logs.SECRETS.add("error", "warning", "2026", rental, stack, scope=rental)
        logs.get_logger("t").error("stack_failed", rental_id=rental, stack_id=stack, error="an error in 2026")
        text = stream.getvalue()
        assert text.startswith("<3>{"), text  # journald's priority: err, decided by the level as logged
        line = json.loads(text[3:])
        assert (line["level"], line["event"], line["rental_id"], line["stack_id"]) == (
            "error",
            "stack_failed",
            rental,
            stack,
        )
        assert line["timestamp"].startswith("2026") and line["error"] == "an *** in ***"
        assert logs.LAST_ERROR.get()["event"] == "stack_failed" and logs.LAST_ERROR.get()["level"] == "error"
    finally:
        logs.SECRETS.discard_many(["error", "warning", "2026", rental, stack], scope=rental)
        logs.configure("warning", json_lines=True)


def test_a_rentals_values_are_masked_in_its_lines_and_those_that_name_none_not_in_anothers() -> None:
    registry = logs.SecretRegistry()
    registry.add("a-secret-value", scope="rental-a")
    registry.add("host-api-key-1")  # the host's own: everywhere
    assert registry.scrub("a-secret-value host-api-key-1", "rental-a") == "*** ***"
    assert registry.scrub("a-secret-value host-api-key-1", "rental-b") == "a-secret-value ***"
    assert registry.scrub("a-secret-value host-api-key-1") == "*** ***"  # a line that names no rental
    registry.discard_many(["a-secret-value"], scope="rental-a")
    assert registry.scrub("a-secret-value", "rental-a") == "a-secret-value"
