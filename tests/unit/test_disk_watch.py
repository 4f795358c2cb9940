"""A rental's share of Docker's disk, the decisions: what counts as the
rental's (writable layers by the agent's label, volumes by their stack's
Compose project) and how big its share is. (On the real engine:
tests/integration/test_disk_watch_engine.py.)"""

from __future__ import annotations

from gpuhost_agent.core.disk_watch import GIB, over_share_message, usage_by_rental
from gpuhost_agent.core.rentals.disk_share import disk_share
from gpuhost_agent.protocol import wire


def test_usage_adds_writable_layers_and_the_stacks_volumes_per_rental() -> None:
    df = {
        "Containers": [
            {"Labels": {wire.LABEL_RENTAL: "r1"}, "SizeRw": 100},
            {"Labels": {wire.LABEL_RENTAL: "r1"}, "SizeRw": 50},
            {"Labels": {wire.LABEL_RENTAL: "r2"}},  # not measured: nothing
            {"Labels": {}, "SizeRw": 999},  # not the agent's
        ],
        "Volumes": [
            {"Labels": {"com.docker.compose.project": "p1"}, "UsageData": {"Size": 1000}},
            {"Labels": {"com.docker.compose.project": "p2"}, "UsageData": {"Size": -1}},  # not measured
            {"Labels": {"com.docker.compose.project": "other"}, "UsageData": {"Size": 7}},  # not a stack here
            {"Labels": None, "UsageData": None},
        ],
    }
    assert usage_by_rental(df, {"p1": "r1", "p2": "r2"}) == {"r1": 1150, "r2": 0}
    assert usage_by_rental({}, {}) == {}


def test_the_share_is_the_hosts_setting_or_the_rentals_part_by_gpus() -> None:
    total, floor = 1000 * GIB, 200 * GIB
    assert disk_share(total, floor, 2, 8, None) == 200 * GIB  # a quarter of the usable 800
    assert disk_share(total, floor, 0, 8, None) == 80 * GIB  # no GPU: a tenth
    assert disk_share(total, floor, 9, 8, None) == 800 * GIB  # never more than the usable disk
    assert disk_share(total, floor, 2, 8, 50 * GIB) == 50 * GIB  # GPUHOST_RENTAL_DISK
    assert disk_share(100, 200, 1, 1, None) == 0  # below the floor already: nothing (the floor refuses deploys)


def test_the_message_names_use_and_share() -> None:
    text = over_share_message(int(1.5 * GIB), GIB)
    assert text.startswith("stopped: the rental's containers and volumes use 1.50 GiB of the host's disk")
    assert "above its share of 1.00 GiB" in text
