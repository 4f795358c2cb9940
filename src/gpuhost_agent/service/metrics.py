"""Prometheus exposition of the agent's figures, rendered by prometheus_client.

The figures are live: each scrape asks the agent's parts for them
(status_server.StatusSource.metric_figures), and `FiguresCollector`, a custom
collector, turns that one snapshot into metric families, so nothing is
mirrored into a global registry between scrapes. The deploy-duration
histogram is the one figure that accumulates; it is a prometheus_client
Histogram the dispatcher observes into, outside any global registry, so two
agents in one process (tests, benchmarks) never share it.

The library renders the text format (escaping, value formatting, `+Inf`,
`_total` for counters) so that our exposition is exactly what Prometheus
reads; what stays ours is which figures there are and what they mean.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuhost_agent.protocol import wire_time

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # what generate_latest writes
# Deploys pull images and wait for containers to settle: seconds to many minutes.
DEPLOY_BUCKETS = (1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
GPU_FIGURES = (
    ("gpuhost_gpu_utilization_percent", "GPU utilization, percent.", "utilizationPercent"),
    ("gpuhost_gpu_memory_used_bytes", "GPU memory in use, bytes.", "memoryUsedBytes"),
    ("gpuhost_gpu_temperature_celsius", "GPU temperature, degrees Celsius.", "temperatureC"),
    ("gpuhost_gpu_power_watts", "GPU power draw, watts.", "powerW"),
)


def deploy_histogram() -> Histogram:
    """Time from a deploy job's start to its outcome, by outcome; built by the
    composition root and handed to the dispatcher."""
    return Histogram(
        "gpuhost_deploy_duration_seconds",
        "Time from a deploy job's start to its outcome.",
        ["outcome"],
        buckets=DEPLOY_BUCKETS,
        registry=None,
    )


def _gauge(name: str, help_text: str, value: float | bool | None) -> GaugeMetricFamily:
    """A None value (a figure not read yet) is left out, not sent as 0; the family is still declared."""
    family = GaugeMetricFamily(name, help_text)
    if value is not None:
        family.add_metric([], float(value))
    return family


def _counter(name: str, help_text: str, value: float | None) -> CounterMetricFamily:
    family = CounterMetricFamily(name, help_text)
    if value is not None:
        family.add_metric([], float(value))
    return family


class FiguresCollector(Collector):
    """The agent's metric families from one snapshot of figures: jobs (outcome ->
    count), jobs_running, deploy_durations (a Histogram or None), reports
    {pending, sent, rejected, dropped}, connected, reconnects, engine_up,
    engine_outages, reconcile_runs, gpus [telemetry entries], uptime_seconds."""

    def __init__(self, figures: Mapping[str, Any]):
        self.figures = figures

    def collect(self) -> Iterable[Metric]:
        figures = self.figures
        yield _gauge("gpuhost_agent_up", "1 while the agent process runs.", 1)
        yield _gauge("gpuhost_agent_uptime_seconds", "Seconds since the agent started.", figures.get("uptime_seconds"))
        yield _gauge(
            "gpuhost_marketplace_connected",
            "1 while the agent has a working marketplace session.",
            bool(figures.get("connected")),
        )
        jobs = CounterMetricFamily("gpuhost_jobs", "Marketplace jobs finished, by outcome.", labels=["outcome"])
        for outcome, count in sorted((figures.get("jobs") or {}).items()):
            jobs.add_metric([outcome], count)
        yield jobs
        yield _gauge("gpuhost_jobs_running", "Jobs being carried out now.", figures.get("jobs_running"))
        durations = figures.get("deploy_durations")
        if isinstance(durations, Histogram):
            yield from durations.collect()
        reports = figures.get("reports") or {}
        yield _gauge(
            "gpuhost_reports_pending",
            "Reports waiting for the marketplace to acknowledge them.",
            reports.get("pending"),
        )
        yield _counter("gpuhost_reports_sent", "Reports the marketplace acknowledged.", reports.get("sent"))
        yield _counter("gpuhost_reports_rejected", "Reports the marketplace refused (4xx).", reports.get("rejected"))
        yield _counter("gpuhost_reports_dropped", "Reports dropped because the queue was full.", reports.get("dropped"))
        yield _counter(
            "gpuhost_marketplace_reconnects",
            "Times the marketplace became reachable again after being lost.",
            figures.get("reconnects"),
        )
        engine_up = figures.get("engine_up")
        yield _gauge(
            "gpuhost_engine_up", "1 while the Docker Engine answers.", None if engine_up is None else bool(engine_up)
        )
        yield _counter(
            "gpuhost_engine_outages", "Times the Docker Engine stopped answering.", figures.get("engine_outages")
        )
        yield _counter("gpuhost_reconcile_runs", "Reconcile passes completed.", figures.get("reconcile_runs"))
        yield from _alert_figures(figures)
        for name, help_text, key in GPU_FIGURES:
            family = GaugeMetricFamily(name, help_text, labels=["uuid", "index"])
            for gpu in figures.get("gpus") or []:
                if "error" not in gpu and gpu.get(key) is not None:
                    family.add_metric([gpu.get("uuid") or "", str(gpu.get("index"))], float(gpu[key]))
            yield family


def _alert_figures(figures: Mapping[str, Any]) -> Iterable[Metric]:
    """What the shipped alerts (prometheus/gpuhost-agent-alerts.yml) judge besides
    the figures above: the last heartbeat the marketplace took, GPUs out of
    service, compliance by check, rentals over their disk share, the last upgrade."""
    beat = figures.get("heartbeat_last_at")
    yield _gauge(
        "gpuhost_heartbeat_last_success_timestamp_seconds",
        "When the marketplace last acknowledged a heartbeat, Unix seconds.",
        wire_time.parse_iso(beat).timestamp() if isinstance(beat, str) and wire_time.is_moment(beat) else None,
    )
    out = GaugeMetricFamily(
        "gpuhost_gpu_out_of_service",
        "1 for each GPU taken out of service by a fault (an Xid).",
        labels=["uuid", "reason"],
    )
    for uuid, reason in sorted((figures.get("gpus_out_of_service") or {}).items()):
        out.add_metric([uuid, reason[:200]], 1.0)
    yield out
    verdict = figures.get("compliance") or {}
    checks = GaugeMetricFamily(
        "gpuhost_compliance_check_ok",
        "1 when a compliance check passes (or does not apply), 0 when it fails.",
        labels=["check"],
    )
    for check in verdict.get("checks") or []:
        checks.add_metric([str(check.get("id"))], 1.0 if check.get("ok") else 0.0)
    yield checks
    yield _gauge(
        "gpuhost_rentals_over_disk_share",
        "Rentals found over their share of the disk at the last pass (their stacks are stopped).",
        figures.get("rentals_over_disk_share"),
    )
    attempt = figures.get("upgrade_last_attempt")
    last = GaugeMetricFamily(
        "gpuhost_upgrade_last_attempt_timestamp_seconds",
        "When the last upgrade attempt ended, Unix seconds, by its version and outcome.",
        labels=["version", "outcome"],
    )
    if isinstance(attempt, dict) and wire_time.is_moment(attempt.get("at")):
        moment = wire_time.parse_iso(attempt["at"]).timestamp()
        last.add_metric([str(attempt.get("version"))[:64], str(attempt.get("outcome"))], moment)
    yield last


def render(figures: Mapping[str, Any]) -> bytes:
    """The Prometheus text format (0.0.4) of one snapshot."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(FiguresCollector(figures))
    return generate_latest(registry)
