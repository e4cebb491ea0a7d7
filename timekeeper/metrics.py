"""Prometheus metrics on a registry of the app's own (not the global one, so apps and tests never clash)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuaccounting.wire import BUDGET_STATES
from timekeeper.db.outage import OutageWatch


class NamespaceCollector(Collector):
    """Per-namespace budget figures, as last loaded by the /metrics handler just before it renders."""

    def __init__(self) -> None:
        self.rows: Sequence[tuple[str, float | None, float, float | None, str]] = ()

    def collect(self) -> Iterator[Metric]:
        budget = GaugeMetricFamily(
            "timekeeper_namespace_budget_gpu_minutes",
            "Budget plus grants of the current period",
            labels=["namespace"],
        )
        used = GaugeMetricFamily(
            "timekeeper_namespace_used_gpu_minutes",
            "GPU-minutes charged in the current period",
            labels=["namespace"],
        )
        remaining = GaugeMetricFamily(
            "timekeeper_namespace_remaining_gpu_minutes",
            "GPU-minutes left in the current period",
            labels=["namespace"],
        )
        state = GaugeMetricFamily(
            "timekeeper_namespace_state", "1 for the namespace's budget state", labels=["namespace", "state"]
        )
        for namespace, available, spent, left, current in self.rows:
            if available is not None:
                budget.add_metric([namespace], available)
            used.add_metric([namespace], spent)
            if left is not None:
                remaining.add_metric([namespace], left)
            for candidate in BUDGET_STATES:
                state.add_metric([namespace, candidate], 1.0 if candidate == current else 0.0)
        yield from (budget, used, remaining, state)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reports = Counter(
            "timekeeper_reports",
            "Reports by result (charged, duplicate, rejected)",
            ["result"],
            registry=self.registry,
        )
        self.ingest_seconds = Histogram(
            "timekeeper_report_ingest_seconds",
            "Time to authorize, check and charge one report (before the commit)",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "timekeeper_ingest_batch_reports",
            "Reports per ingest batch (one transaction)",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500),
            registry=self.registry,
        )
        self.batch_failures = Counter(
            "timekeeper_ingest_batch_failures",
            "Failed ingest batches: outage (answered 503) or refused (its reports retried one by one)",
            ["reason"],
            registry=self.registry,
        )
        self.outages = OutageWatch(self.registry)
        self.namespaces = NamespaceCollector()
        self.registry.register(self.namespaces)
