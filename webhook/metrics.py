"""The webhook's Prometheus metrics, on a registry of the app's own (so tests and apps never collide)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpuaccounting.counters import start_at_zero
from httpguard.connections import REASONS as CONNECTION_REASONS

LATENCY_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.25)


class WebhookMetrics:
    def __init__(self, state_age: Callable[[], float | None]) -> None:
        self.registry = CollectorRegistry()
        self.admissions = Counter(
            "webhook_admissions",
            "Admission requests answered, by endpoint, operation and result",
            ["endpoint", "operation", "result"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "webhook_admission_duration_seconds",
            "Time from the body received to the answer encoded, inside the server",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.malformed = Counter(
            "webhook_malformed_requests",
            "Bodies that were not AdmissionReviews (answered 400)",
            ["endpoint"],
            registry=self.registry,
        )
        self.refused = Counter(
            "webhook_requests_refused",
            "Requests and connections refused by a limit, timed out or given way to a newcomer"
            " (docs/webhook.md, Limits), by reason",
            ["reason"],
            registry=self.registry,
        )
        start_at_zero(self.refused, reason=CONNECTION_REASONS)
        self.stale_decisions = Counter(
            "webhook_state_stale_decisions",
            "Priority decisions made on budget state older than the maximum age",
            registry=self.registry,
        )
        self.missing_decisions = Counter(
            "webhook_state_missing_decisions",
            "Priority decisions made before any budget state was loaded",
            registry=self.registry,
        )
        self.priority_decisions = Counter(
            "webhook_priority_decisions",
            "Priority decisions of GPU pods, by the policy rule that applied",
            ["rule"],
            registry=self.registry,
        )
        self.priority_class_watch_errors = Counter(
            "webhook_priority_class_watch_errors",
            "Failed lists or watches of the cluster's PriorityClasses (each retried)",
            registry=self.registry,
        )
        self.workload_pod_watch_errors = Counter(
            "webhook_workload_pod_watch_errors",
            "Failed lists or watches of the GPU pods the webhook admitted (each retried)",
            registry=self.registry,
        )
        self.dra_watch_errors = Counter(
            "webhook_dra_watch_errors",
            "Failed discoveries, lists, watches or reads of DRA claims, templates and DeviceClasses",
            registry=self.registry,
        )
        # The app sets its function to the catalog's count.
        self.priority_classes = Gauge(
            "webhook_priority_classes",
            "PriorityClasses known from the Kubernetes API (-1: never listed, or the watch is off)",
            registry=self.registry,
        )
        self.workload_pods = Gauge(  # the app sets its function to the workload view's count
            "webhook_workload_pods",
            "GPU pods the webhook admitted, known by workload (-1: never listed, or the watch is off)",
            registry=self.registry,
        )
        self.state_polls = Counter(
            "webhook_state_polls",
            "Polls of the timekeeper's admission state, by result",
            ["result"],
            registry=self.registry,
        )
        self.state_version = Gauge(
            "webhook_state_version", "Version of the cached admission state", registry=self.registry
        )
        age = Gauge(
            "webhook_state_age_seconds",
            "Seconds since the admission state was last confirmed (-1: never loaded)",
            registry=self.registry,
        )
        age.set_function(lambda: _or_minus_one(state_age()))


def _or_minus_one(value: float | None) -> float:
    return -1.0 if value is None else value
