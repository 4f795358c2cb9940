"""What a failed deploy says, the pure part: which service could not get its
image, and the reason a container gives. (On the real engine, with Compose's
own failures: tests/integration/test_deploy_errors.py.)"""

from __future__ import annotations

from gpuhost_agent.core.stacks.container_list import RENTAL_MEMORY_REACHED
from gpuhost_agent.core.stacks.container_list import SERVICE_LABEL as SERVICE
from gpuhost_agent.core.stacks.deploy_failures import (
    describe_container,
    failure_reason,
    pull_failure,
    service_images,
    with_output,
    without_registry_reply,
)
from gpuhost_agent.protocol import wire


def test_the_service_whose_image_is_absent_is_named():
    model = {"services": {"web": {"image": "ghcr.io/x/web:1"}, "db": {"image": "postgres:16"}, "init": {}}}
    images = service_images(model)
    assert images == {"db": "postgres:16", "web": "ghcr.io/x/web:1"}
    message = pull_failure(images, ["ghcr.io/x/web:1"], "manifest unknown")
    assert message is not None
    assert message.startswith("deploy failed: service 'web' could not get its image 'ghcr.io/x/web:1'")
    assert "'db'" not in message and message.endswith(": manifest unknown")
    assert pull_failure(images, [], "some other failure") is None


def test_two_services_sharing_an_absent_image_are_both_named():
    images = {"a": "reg/img:1", "b": "reg/img:1"}
    message = pull_failure(images, ["reg/img:1"], "denied") or ""
    assert "service 'a'" in message and "service 'b'" in message


def test_reason_and_output():
    running = {"State": "running", "Status": "Up 3 seconds (unhealthy)"}
    assert failure_reason(running, None, False) == "is running but unhealthy (its healthcheck fails)"
    assert failure_reason({"State": "exited"}, 3, False) == "exited with code 3"
    assert failure_reason({"State": "exited"}, 137, True) == "was killed for running out of memory"
    assert failure_reason({"State": "dead"}, None, False) == "is dead"
    assert with_output("service 'x' exited", "") == "service 'x' exited"
    assert with_output("m", "y" * 900).endswith("y" * 500) and len(with_output("m", "y" * 900)) < 600


class _StoppedEngine:
    """The two engine calls describe_container makes, for one OOM-killed container."""

    async def container_state(self, container_id: str) -> dict:
        return {"Running": False, "ExitCode": 137, "OOMKilled": True}

    async def log_tail(self, container_id: str, lines: int) -> str:
        return "allocating"


async def test_a_deploy_killed_at_the_rentals_memory_limit_says_so_like_the_container_list() -> None:
    """A service OOM-killed right after `up` because the rental's
    containers together reached the rental's limit; Docker's OOMKilled does
    not tell that from the container's own limit, the rental's cgroup does."""
    container = {"Id": "c1", "State": "exited", "Labels": {wire.LABEL_RENTAL: "r-1", SERVICE: "train"}}
    asked: list[str] = []

    def reached(rental_id: str) -> bool:
        asked.append(rental_id)
        return True

    engine = _StoppedEngine()
    told = await describe_container(engine, container, " right after it started", reached)  # type: ignore[arg-type]
    assert asked == ["r-1"]
    assert told.startswith("service 'train' was killed for running out of memory: " + RENTAL_MEMORY_REACHED)
    assert told.endswith("; its last output: allocating")
    own = await describe_container(engine, container, "", lambda _rental: False)  # type: ignore[arg-type]
    assert own == "service 'train' was killed for running out of memory; its last output: allocating"


def test_a_registry_reply_is_not_read_back_to_the_renter():
    """Whatever answered as a registry (a host service once, now a
    redirect's or a token realm's target) is not echoed in errorMsg."""
    engine_error = (
        "Error response from daemon: error parsing HTTP 404 response body: invalid character 'H' looking for "
        'beginning of value: "HOST-LOOPBACK-SECRET path=/v2/internal/x/manifests/tag"'
    )
    cleaned = without_registry_reply(engine_error)
    assert "HOST-LOOPBACK-SECRET" not in cleaned and "invalid character" not in cleaned
    assert cleaned.startswith("Error response from daemon: error parsing HTTP 404 response body")
    message = pull_failure({"a": "r.example/x:1"}, ["r.example/x:1"], "manifest unknown " + "x" * 5000) or ""
    assert len(message) < 600 and message.endswith("...")
