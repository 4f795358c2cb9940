"""Attempts on the host_asks rewrites
that HELD, through the real Compose CLI and the real sandbox decision. Kept as
regression guards: no host path reaches the engine by any of these."""

from __future__ import annotations

import pytest
from support.sandbox_decide import decide_file

from gpuhost_agent.runtime.compose import ComposeRunner, find_compose_command

HELD = {
    # the renter pre-declares the volume host_asks will name, with a bind driver_opts: replaced, opts gone
    "own_host_volume_with_bind_opts": (
        "services:\n  a:\n    image: busybox\n    volumes: ['/srv/m:/x', 'host_srv_m:/y']\n"
        "volumes:\n  host_srv_m:\n    driver_opts: {type: none, o: bind, device: /etc}\n"
    ),
    "merge_key_driver_opts": (
        "x-o: &o {type: none, o: bind, device: /etc}\nservices:\n  a:\n    image: busybox\n"
        "    volumes: ['vol1:/x']\nvolumes:\n  vol1:\n    <<: {driver_opts: *o}\n"
    ),
    "external_other_rentals_volume": (
        "services:\n  a:\n    image: busybox\n    volumes: ['vol1:/x']\n"
        "volumes:\n  vol1:\n    external: true\n    name: otherproject_data\n"
    ),
    "dotdot_and_trailing_slash_to_etc": (
        "services:\n  a:\n    image: busybox\n    volumes: ['/home/../etc:/x', '/etc/:/z']\n"
    ),
    "long_syntax_bind_propagation": (
        "services:\n  a:\n    image: busybox\n    volumes:\n      - type: bind\n        source: /mnt\n"
        "        target: /x\n        bind: {propagation: rshared, create_host_path: true}\n"
    ),
    "env_file_above_the_stack": "services:\n  a:\n    image: busybox\n    env_file: ['../../../../etc/shadow']\n",
}


@pytest.fixture(scope="module")
def compose(tmp_path_factory) -> ComposeRunner:
    return ComposeRunner(find_compose_command(), tmp_path_factory.mktemp("docker-config"))


@pytest.mark.parametrize("name", sorted(HELD))
async def test_no_host_path_reaches_the_engine(compose, tmp_path, name) -> None:
    problems, hardened, _ = await decide_file(
        compose, HELD[name], tmp_path / "stacks" / "s", foreign=frozenset({"otherproject_data"})
    )
    if hardened is None:
        assert problems
        return
    for service in hardened["services"].values():
        assert all(m.get("type") in ("volume", "tmpfs") for m in service.get("volumes") or []), service["volumes"]
        assert "env_file" not in service
    for spec in (hardened.get("volumes") or {}).values():
        assert not (spec or {}).get("driver_opts") and not (spec or {}).get("external")
        assert str((spec or {}).get("name", "")).startswith("corpus_")
