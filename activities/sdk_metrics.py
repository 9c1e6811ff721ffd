"""The Temporal SDK's own metrics on the worker's metrics port, beside Parley's.

The SDK (its Rust core) measures what an SRE needs to size workers: schedule-to-start
latencies, free task slots, sticky cache hits and size, poll outcomes, activity and workflow
task outcomes. Its built-in Prometheus exporter would need a second port, so instead the
runtime records into a `MetricBuffer` that `SdkMetrics.drain` empties every second, and a
prometheus_client collector serves the totals from the default registry with the app's own.
Core's log lines are forwarded to Python's `temporalio.core` logger, so they pass through the
process's log handler (ids, redaction) too.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from temporalio.runtime import (
    BUFFERED_METRIC_KIND_COUNTER,
    BUFFERED_METRIC_KIND_GAUGE,
    BufferedMetricUpdate,
    LogForwardingConfig,
    LoggingConfig,
    MetricBuffer,
    MetricBufferDurationFormat,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)

# Latencies are recorded in seconds; these bounds cover a sticky hit (ms) to a long stream.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
DRAIN_EVERY_S = 1.0

Labels = tuple[tuple[str, str], ...]


class _Histogram:
    def __init__(self) -> None:
        self.buckets = [0] * len(BUCKETS)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.count += 1
        self.sum += value
        for index, bound in enumerate(BUCKETS):
            if value <= bound:
                self.buckets[index] += 1


class SdkMetrics(Collector):
    """Totals of the SDK's buffered metric updates, served as Prometheus families."""

    def __init__(self, buffer: MetricBuffer) -> None:
        self._buffer = buffer
        self._lock = threading.Lock()  # drained on the event loop, collected on the HTTP thread
        self._kinds: dict[str, tuple[int, str]] = {}
        self._values: dict[str, dict[Labels, float]] = {}
        self._histograms: dict[str, dict[Labels, _Histogram]] = {}

    def drain(self) -> None:
        updates = self._buffer.retrieve_updates()
        with self._lock:
            for update in updates:
                self._apply(update)

    def _apply(self, update: BufferedMetricUpdate) -> None:
        metric = update.metric
        self._kinds[metric.name] = (metric.kind, metric.description or metric.name)
        labels = _labels(update.attributes)
        if metric.kind == BUFFERED_METRIC_KIND_COUNTER:
            series = self._values.setdefault(metric.name, {})
            series[labels] = series.get(labels, 0.0) + update.value
        elif metric.kind == BUFFERED_METRIC_KIND_GAUGE:
            self._values.setdefault(metric.name, {})[labels] = float(update.value)
        else:
            histograms = self._histograms.setdefault(metric.name, {})
            histograms.setdefault(labels, _Histogram()).observe(float(update.value))

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            for name, (kind, description) in sorted(self._kinds.items()):
                if kind == BUFFERED_METRIC_KIND_COUNTER:
                    family = Metric(name, description, "counter")
                    for labels, value in self._values.get(name, {}).items():
                        family.add_sample(f"{name}_total", dict(labels), value)
                elif kind == BUFFERED_METRIC_KIND_GAUGE:
                    family = Metric(name, description, "gauge")
                    for labels, value in self._values.get(name, {}).items():
                        family.add_sample(name, dict(labels), value)
                else:
                    family = Metric(name, description, "histogram")
                    for labels, histogram in self._histograms.get(name, {}).items():
                        _add_histogram(family, name, dict(labels), histogram)
                yield family

    async def drain_forever(self) -> None:
        while True:
            self.drain()
            await asyncio.sleep(DRAIN_EVERY_S)


def _labels(attributes: Mapping[str, Any]) -> Labels:
    return tuple(sorted((str(key), str(value)) for key, value in attributes.items()))


def _add_histogram(family: Metric, name: str, labels: dict[str, str], h: _Histogram) -> None:
    for bound, count in zip(BUCKETS, h.buckets, strict=True):
        family.add_sample(f"{name}_bucket", {**labels, "le": str(bound)}, count)
    family.add_sample(f"{name}_bucket", {**labels, "le": "+Inf"}, h.count)
    family.add_sample(f"{name}_count", labels, h.count)
    family.add_sample(f"{name}_sum", labels, h.sum)


def sdk_runtime(*, metrics: bool) -> tuple[Runtime, SdkMetrics | None]:
    """A Temporal runtime whose core logs go through Python logging and, with `metrics`,
    whose metrics are registered with the default Prometheus registry."""
    buffer = MetricBuffer(100_000, MetricBufferDurationFormat.SECONDS) if metrics else None
    runtime = Runtime(
        telemetry=TelemetryConfig(
            logging=LoggingConfig(
                filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
                forwarding=LogForwardingConfig(logger=logging.getLogger("temporalio.core")),
            ),
            metrics=buffer,
        )
    )
    if buffer is None:
        return runtime, None
    collector = SdkMetrics(buffer)
    REGISTRY.register(collector)
    return runtime, collector
