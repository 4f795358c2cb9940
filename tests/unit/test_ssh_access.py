"""Who may log in over SSH and to which container, decided without Docker or
HTTP: login names, the container choice on Docker's labels, the key cache,
the session's environment, and the `ssh` channel request."""

from __future__ import annotations

import asyncio

import pytest

from gpuhost_agent.protocol import ssh_login, wire
from gpuhost_agent.streams.requests import Refusal, SshRequest, parse_request
from gpuhost_agent.streams.ssh import access as ssh_access
from gpuhost_agent.streams.ssh.access import RentalKeys, parse_login, pick_any, pick_container
from gpuhost_agent.streams.ssh.session import exec_command, exec_env

STACK = "3f2a9c1d-0000-4000-8000-000000000001"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA7xkey renter@laptop"


def _container(service: str = "web", number: str = "1", state: str = "running", **labels: str) -> dict:
    base = {
        wire.LABEL_MANAGED: "true",
        wire.LABEL_ENV: "env",
        wire.LABEL_RENTAL: "rental",
        wire.LABEL_STACK: STACK,
        wire.LABEL_SSH: "true",
        ssh_access.SERVICE_LABEL: service,
        ssh_access.NUMBER_LABEL: number,
    }
    return {"Id": f"{service}-{number}", "State": state, "Labels": {**base, **labels}}


OTHER = "77e0b4aa-0000-4000-8000-000000000002"  # another stack of the same rental


def test_login_names_pick_a_stack_of_the_endpoints_rental_and_its_service():
    """One endpoint per rental: the prefix picks the stack
    among those the ssh request lists; any other prefix, another rental's
    stack included, is refused as an unknown name is."""
    both = (STACK, OTHER)
    assert ssh_login.ssh_login_name("web", STACK) == "web.3f2a9c1d"
    assert parse_login("web.3f2a9c1d", both) == ("web", STACK)
    assert parse_login("web.77e0b4aa", both) == ("web", OTHER)
    assert parse_login("my.dotted.svc.3f2a9c1d", both) == ("my.dotted.svc", STACK)
    assert parse_login("web.77e0b4aa", (STACK,)) is None  # not a stack of this endpoint
    for name in ("web", "web.3f2a9c1e", ".3f2a9c1d", "web.", "root", "web.3f2a9c1", "web.3f2a9c1d-"):
        assert parse_login(name, both) is None, name


def test_the_container_is_the_services_first_running_replica_with_every_label():
    chosen = pick_container([_container(number="2"), _container(number="1")], "web", "env", "rental", STACK)
    assert chosen is not None and chosen["Id"] == "web-1"
    assert pick_container([_container(state="exited")], "web", "env", "rental", STACK) is None
    assert pick_container([_container()], "db", "env", "rental", STACK) is None
    assert pick_container([_container()], "web", None, "rental", STACK) is None  # no session yet
    for key, value in (
        (wire.LABEL_SSH, "false"),  # the template did not ask for SSH
        (wire.LABEL_RENTAL, "other"),
        (wire.LABEL_ENV, "other"),
        (wire.LABEL_MANAGED, "false"),
    ):
        assert pick_container([_container(**{key: value})], "web", "env", "rental", STACK) is None, key
    assert pick_any([_container("db", **{wire.LABEL_SSH: ""}), _container("web")], "env", "rental", STACK)["Id"] == (
        "web-1"
    )


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_keys_are_cached_briefly_and_asked_again_for_an_unknown_key():
    lists = {"rental": [KEY]}
    asked: list[str] = []

    async def fetch(rental_id: str) -> list[str]:
        asked.append(rental_id)
        await asyncio.sleep(0)
        return lists[rental_id]

    clock = _Clock()
    keys = RentalKeys(fetch, clock)
    other = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOther later-added"
    results = await asyncio.gather(*(keys.allows("rental", KEY) for _ in range(20)))
    assert all(results) and asked == ["rental"]  # one request for a burst of logins
    assert await keys.allows("rental", "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA7xkey another-comment")
    lists["rental"] = [KEY, other]
    assert not await keys.allows("rental", other) and len(asked) == 1  # too soon to ask again
    clock.now += ssh_access.KEYS_RECHECK_SECONDS
    assert await keys.allows("rental", other) and len(asked) == 2  # an added key works seconds later
    lists["rental"] = []
    clock.now += ssh_access.KEYS_FRESH_SECONDS - 0.5
    assert await keys.allows("rental", KEY) and len(asked) == 2  # fresh enough: no request
    clock.now += 1
    assert not await keys.allows("rental", KEY) and len(asked) == 3  # a removed key stops working


async def test_a_marketplace_error_refuses_rather_than_guesses():
    async def fetch(_rental_id: str) -> list[str]:
        raise ConnectionError("marketplace down")

    with pytest.raises(ConnectionError):
        await RentalKeys(fetch).allows("rental", KEY)


def test_session_commands_and_environment():
    assert exec_command(None) == ["/bin/sh"]
    assert exec_command("ls -la; exit 3") == ["/bin/sh", "-c", "ls -la; exit 3"]
    env = exec_env(
        {"LANG": "C.UTF-8", "NVIDIA_VISIBLE_DEVICES": "all", "BAD NAME": "x", "NUL": "a\x00b", "BIG": "x" * 5000},
        "xterm-256color",
    )
    assert env == {"LANG": "C.UTF-8", "TERM": "xterm-256color"}
    assert len(exec_env({f"V{i}": "1" for i in range(500)}, None)) == 64


def test_the_ssh_channel_request():
    ask = {"type": "ssh", "streamId": "s1", "rentalId": "r"}
    assert parse_request({**ask, "stackIds": [STACK, OTHER, STACK]}) == SshRequest("s1", "r", (STACK, OTHER))
    assert parse_request({**ask, "stackId": STACK}) == SshRequest("s1", "r", (STACK,))  # an endpoint per stack
    refused = parse_request({**ask, "stackId": "../x"})
    assert isinstance(refused, Refusal) and refused.status == 400 and "stackId" in refused.error
    for stack_ids in ([], ["../x"], STACK, [STACK] * 65, None):
        refused = parse_request({**ask, "stackIds": stack_ids})
        assert isinstance(refused, Refusal) and refused.status == 400 and "stackIds" in refused.error, stack_ids
