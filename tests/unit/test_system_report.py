"""The report's fingerprint (what makes systemData go out again) and the
marketplace's checks on what it shows renters. Pure."""

from __future__ import annotations

import copy

from support.machine_samples import GPU_BEATS, good_host, heartbeat

from gpuhost_agent.inventory.system_data import build_report
from gpuhost_agent.local_marketplace.host_api import heartbeat_problem, system_data_problem
from gpuhost_agent.protocol.requirements import Requirements

GIB = 1024**3


def _data() -> dict:
    data = good_host()
    data.update(
        probedAt="2026-11-21T10:00:00.000000Z", agentVersion="0.1.0", hostname="gpu-1", networkSpeed=None, location=None
    )
    data["host"].update(
        cpu={"model": "EPYC", "physicalCores": 64, "logicalCores": 128}, memory={"totalBytes": 512 * GIB}
    )
    data["host"]["storage"]["freeBytes"] = 800 * GIB + 100 * 1024**2
    return data


def test_fingerprint_ignores_live_figures() -> None:
    base = build_report(_data(), Requirements(), clock_skew_seconds=0.2)
    later = _data()
    later["probedAt"] = "2026-11-21T10:05:00.000000Z"
    later["host"]["clock"]["maxErrorMs"] = 99.0
    later["host"]["storage"]["freeBytes"] += 300 * 1024**2  # same whole GiB
    again = build_report(later, Requirements(), clock_skew_seconds=0.3)  # the wording quotes the skew
    assert again["compliance"]["checks"] != base["compliance"]["checks"]
    assert again["fingerprint"] == base["fingerprint"]


def test_fingerprint_moves_when_something_shown_changes() -> None:
    base = build_report(_data(), Requirements(), None)["fingerprint"]
    for change in (
        lambda d: d["nvml"]["gpus"].pop(),
        lambda d: d["host"]["storage"].update(freeBytes=10 * GIB),
        lambda d: d.update(location="DE-Berlin"),
        lambda d: d["nvml"].update(driverVersion="560.28.03"),
    ):
        data = copy.deepcopy(_data())
        change(data)
        assert build_report(data, Requirements(), None)["fingerprint"] != base


def test_marketplace_checks_the_fields_renters_see() -> None:
    report = {**build_report(_data(), Requirements(), None), "reportedAt": "2026-11-21T10:00:00Z"}
    assert system_data_problem(report) is None
    bad = copy.deepcopy(report)
    bad["listing"]["gpuVRAM"] = "80 GB"
    assert system_data_problem(bad) == "listing.gpuVRAM must be a whole number or null"
    bad["listing"]["gpuVRAM"] = 80.5
    assert system_data_problem(bad) == "listing.gpuVRAM must be a whole number or null"
    bad = copy.deepcopy(report)
    bad["compliance"]["checks"][0]["remedy"] = 5
    assert "compliance.checks" in system_data_problem(bad)
    bad = copy.deepcopy(report)
    bad["compliance"].update(isCompliant=False, failedComplianceReason="")
    assert "failedComplianceReason is required" in system_data_problem(bad)


def test_heartbeat_figures_must_be_numbers() -> None:
    beat = heartbeat()
    assert heartbeat_problem(beat) is None
    assert (
        heartbeat_problem({**beat, "host": {**beat["host"], "load1": "<script>"}})
        == "host.load1 must be a non-negative number"
    )
    assert heartbeat_problem({**beat, "host": {"load1": 0.5}}) == "host.load5 is required"
    hot = {**GPU_BEATS[0], "temperatureC": "hot"}
    assert heartbeat_problem({**beat, "gpus": [hot]}) == "gpus[0].temperatureC must be a non-negative number or null"
    half = {**GPU_BEATS[0], "memoryUsedBytes": 1.5}
    assert heartbeat_problem({**beat, "gpus": [half]}) == "gpus[0].memoryUsedBytes must be a whole number or null"
    assert "or an error" in heartbeat_problem({**beat, "gpus": [{"index": 0, "uuid": "GPU-1"}]})
    assert "fingerprint is required" in heartbeat_problem({k: v for k, v in beat.items() if k != "fingerprint"})
    assert heartbeat_problem({**beat, "gpus": ["GPU-1"]}) == "gpus[0] must be an object with an index"
