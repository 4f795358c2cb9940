"""Prometheus text exposition (format 0.0.4), from plain figures to text.

Pure: nothing here reads the agent; `status_server` gathers the figures into a
dict and `collect` turns them into metric families, `render` into text. The
deploy-duration histogram is kept here too (`Histogram`), so the code that
times deploys only calls `observe`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Deploys pull images and wait for containers to settle: seconds to many minutes.
DEPLOY_BUCKETS = (1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def escape_label_value(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float | int | bool) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


@dataclass
class Sample:
    suffix: str                      # "" or "_bucket", "_sum", "_count"
    labels: Mapping[str, object]
    value: float | int | bool


@dataclass
class MetricFamily:
    name: str
    type: str                        # counter, gauge, histogram, summary, untyped
    help: str
    samples: list[Sample] = field(default_factory=list)

    def add(self, value: float | int | bool | None, suffix: str = "", **labels: object) -> "MetricFamily":
        """A None value (a figure NVML could not read) is left out, not sent as 0."""
        if value is not None:
            self.samples.append(Sample(suffix, labels, value))
        return self


def _labels_text(labels: Mapping[str, object]) -> str:
    if not labels:
        return ""
    for key in labels:
        if not _LABEL.match(key) or key.startswith("__"):
            raise ValueError(f"bad label name {key!r}")
    return "{" + ",".join(f'{key}="{escape_label_value(value)}"' for key, value in labels.items()) + "}"


def render(families: Iterable[MetricFamily]) -> str:
    lines: list[str] = []
    for family in families:
        if not _NAME.match(family.name):
            raise ValueError(f"bad metric name {family.name!r}")
        lines.append(f"# HELP {family.name} {escape_help(family.help)}")
        lines.append(f"# TYPE {family.name} {family.type}")
        for sample in family.samples:
            lines.append(f"{family.name}{sample.suffix}{_labels_text(sample.labels)} {format_value(sample.value)}")
    return "\n".join(lines) + "\n"


class Histogram:
    """A cumulative histogram, optionally split by labels (e.g. outcome)."""

    def __init__(self, buckets: Iterable[float] = DEPLOY_BUCKETS):
        self.buckets = tuple(sorted(float(b) for b in buckets if not math.isinf(b)))
        self._series: dict[tuple[tuple[str, str], ...], list] = {}  # labels -> [bucket counts, sum, count]

    def observe(self, value: float, **labels: str) -> None:
        key = tuple(sorted((k, str(v)) for k, v in labels.items()))
        series = self._series.setdefault(key, [[0] * len(self.buckets), 0.0, 0])
        for index, bound in enumerate(self.buckets):
            if value <= bound:
                series[0][index] += 1
        series[1] += value
        series[2] += 1

    @property
    def count(self) -> int:
        return sum(series[2] for series in self._series.values())

    def family(self, name: str, help_text: str) -> MetricFamily:
        family = MetricFamily(name, "histogram", help_text)
        for key, (counts, total, count) in sorted(self._series.items()):
            labels = dict(key)
            for bound, bucket_count in zip(self.buckets, counts):
                family.add(bucket_count, "_bucket", **labels, le=format_value(bound))
            family.add(count, "_bucket", **labels, le="+Inf")
            family.add(total, "_sum", **labels)
            family.add(count, "_count", **labels)
        return family


def collect(figures: Mapping) -> list[MetricFamily]:
    """The agent's metric families from a dict of figures (see status_server.metric_figures):
    jobs (outcome -> count), jobs_running, deploy_durations (a Histogram or None),
    reports {pending, sent, rejected, dropped}, connected, reconnects, engine_up, engine_outages,
    reconcile_runs, gpus [telemetry.snapshot()'s "gpus" entries], uptime_seconds."""
    families = [
        MetricFamily("gpuhost_agent_up", "gauge", "1 while the agent process runs.").add(1),
        MetricFamily("gpuhost_agent_uptime_seconds", "gauge", "Seconds since the agent started.")
        .add(figures.get("uptime_seconds")),
        MetricFamily("gpuhost_marketplace_connected", "gauge", "1 while the agent has a working marketplace session.")
        .add(bool(figures.get("connected"))),
    ]
    jobs = MetricFamily("gpuhost_jobs_total", "counter", "Marketplace jobs finished, by outcome.")
    for outcome, count in sorted((figures.get("jobs") or {}).items()):
        jobs.add(count, outcome=outcome)
    families.append(jobs)
    families.append(MetricFamily("gpuhost_jobs_running", "gauge", "Jobs being carried out now.")
                    .add(figures.get("jobs_running")))
    durations = figures.get("deploy_durations")
    if isinstance(durations, Histogram):
        families.append(durations.family("gpuhost_deploy_duration_seconds",
                                         "Time from a deploy job's start to its outcome."))
    reports = figures.get("reports") or {}
    families += [
        MetricFamily("gpuhost_reports_pending", "gauge", "Reports waiting for the marketplace to acknowledge them.")
        .add(reports.get("pending")),
        MetricFamily("gpuhost_reports_sent_total", "counter", "Reports the marketplace acknowledged.")
        .add(reports.get("sent")),
        MetricFamily("gpuhost_reports_rejected_total", "counter", "Reports the marketplace refused (4xx).")
        .add(reports.get("rejected")),
        MetricFamily("gpuhost_reports_dropped_total", "counter", "Reports dropped because the queue was full.")
        .add(reports.get("dropped")),
        MetricFamily("gpuhost_marketplace_reconnects_total", "counter",
                     "Times the marketplace became reachable again after being lost.").add(figures.get("reconnects")),
        MetricFamily("gpuhost_engine_up", "gauge", "1 while the Docker Engine answers.")
        .add(None if figures.get("engine_up") is None else bool(figures.get("engine_up"))),
        MetricFamily("gpuhost_engine_outages_total", "counter", "Times the Docker Engine stopped answering.")
        .add(figures.get("engine_outages")),
        MetricFamily("gpuhost_reconcile_runs_total", "counter", "Reconcile passes completed.")
        .add(figures.get("reconcile_runs")),
    ]
    gpu_figures = (
        ("gpuhost_gpu_utilization_percent", "GPU utilization, percent.", "utilizationPercent"),
        ("gpuhost_gpu_memory_used_bytes", "GPU memory in use, bytes.", "memoryUsedBytes"),
        ("gpuhost_gpu_temperature_celsius", "GPU temperature, degrees Celsius.", "temperatureC"),
        ("gpuhost_gpu_power_watts", "GPU power draw, watts.", "powerW"),
    )
    for name, help_text, key in gpu_figures:
        family = MetricFamily(name, "gauge", help_text)
        for gpu in figures.get("gpus") or []:
            if "error" in gpu:
                continue
            family.add(gpu.get(key), uuid=gpu.get("uuid") or "", index=gpu.get("index"))
        families.append(family)
    return families
