"""Prometheus metrics on a registry of the app's own (not the global one, so apps and tests never clash)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from gpuaccounting.counters import start_at_zero
from gpuaccounting.wire import BUDGET_STATES
from httpguard.connections import REASONS as CONNECTION_REASONS
from timekeeper.context import Slot
from timekeeper.db.outage import OutageWatch
from timekeeper.domain.clusters import LOCAL_CLUSTER_LABEL, cluster_of, split_key

REPORT_RESULTS = ("charged", "duplicate", "rejected")
BATCH_FAILURE_REASONS = ("outage", "refused")
GITOPS_OUTCOMES = ("ok", "error")
GITOPS_ACTIONS = ("applied", "released")
DOWNGRADE_OUTCOMES = ("evicted", "blocked_by_pdb", "deleted_past_pdb", "grace_shortened")
KUEUE_TRIGGERS = ("pass", "watch")

# The connection guard's (httpguard.connections) refusals, timeouts and connections that gave way. The
# guard is built before the app and handed to each worker, so it counts through this module's function
# into a counter of the process, which each app's registry shows.
CONNECTIONS_REFUSED = Counter(
    "timekeeper_connections_refused",
    "Connections refused, timed out or given way to a newcomer by the connection guard, by reason "
    "(docs/security.md, Hostile clients)",
    ["reason"],
    registry=None,
)
start_at_zero(CONNECTIONS_REFUSED, reason=CONNECTION_REASONS)


def count_refused_connection(reason: str) -> None:
    """The guard's `on_refused` (a module function: the guard is pickled for uvicorn's workers)."""
    CONNECTIONS_REFUSED.labels(reason=reason).inc()


def add_namespace_sample(family: Metric, key: str, value: float, **labels: str) -> None:
    """A sample of `family` for the namespace `key` (timekeeper/domain/clusters.py): labelled `namespace`,
    the bare name, and `cluster`, the member's name, where it is a member's. A fleet's hub exports every
    member's namespaces, and `team-x` of two clusters are two series; the local cluster's carry no
    `cluster` label (what Prometheus makes of an empty one), so a single cluster's scrape is unchanged."""
    cluster, namespace = split_key(key)
    names = {"namespace": namespace} if cluster is None else {"cluster": cluster, "namespace": namespace}
    family.samples.append(Sample(family.name, names | labels, value))


@dataclass(frozen=True, slots=True)
class NamespaceRow:
    """One namespace's figures for the scrape (None: the gauge has no sample for it)."""

    namespace: str  # its key (timekeeper/domain/clusters.py)
    budget: float | None  # budget plus grants
    used: float
    remaining: float | None
    state: str
    burn_rate: float  # GPU-minutes per hour over the forecast window
    exhaustion_seconds: float | None  # from now until the forecast exhaustion, when within the period
    # Each budgeted GPU model's (remaining raw GPU-minutes, state).
    models: Mapping[str, tuple[float, str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BudgetReadout:
    """What one /metrics request read from the database: every namespace's and pool's figures, the idle
    pods (namespace, pods, GPUs) and the running pods of no known GPU model per namespace."""

    namespaces: Sequence[NamespaceRow]
    pools: Sequence[tuple[str, float, float, str]]
    idle: Sequence[tuple[str, int, float]]
    unweighted_pods: Mapping[str, int]


class NamespaceCollector(Collector):
    """Per-namespace budget figures, as the last successful read of the database left them."""

    def __init__(self) -> None:
        self.rows: Sequence[NamespaceRow] = ()

    def collect(self) -> Iterator[Metric]:
        budget = GaugeMetricFamily(
            "timekeeper_namespace_budget_gpu_minutes",
            "Budget plus grants of the current period",
        )
        used = GaugeMetricFamily(
            "timekeeper_namespace_used_gpu_minutes",
            "GPU-minutes charged in the current period",
        )
        remaining = GaugeMetricFamily(
            "timekeeper_namespace_remaining_gpu_minutes",
            "GPU-minutes left in the current period",
        )
        state = GaugeMetricFamily("timekeeper_namespace_state", "1 for the namespace's budget state")
        burn_rate = GaugeMetricFamily(
            "timekeeper_namespace_burn_rate_gpu_minutes_per_hour",
            "GPU-minutes charged per hour over the forecast window",
        )
        model_remaining = GaugeMetricFamily(
            "timekeeper_model_budget_remaining_gpu_minutes",
            "Raw GPU-minutes left of a GPU model's own budget in the current period",
        )
        model_state = GaugeMetricFamily(
            "timekeeper_model_budget_state",
            "1 for the state of a GPU model's own budget",
        )
        exhaustion = GaugeMetricFamily(
            "timekeeper_namespace_forecast_exhaustion_seconds",
            "Seconds until the namespace's budget runs out at its burn rate; only for namespaces "
            "forecast to run out within the current period",
        )
        for row in self.rows:
            key = row.namespace
            if row.budget is not None:
                add_namespace_sample(budget, key, row.budget)
            add_namespace_sample(used, key, row.used)
            if row.remaining is not None:
                add_namespace_sample(remaining, key, row.remaining)
            for candidate in BUDGET_STATES:
                add_namespace_sample(state, key, 1.0 if candidate == row.state else 0.0, state=candidate)
            add_namespace_sample(burn_rate, key, row.burn_rate)
            if row.exhaustion_seconds is not None:
                add_namespace_sample(exhaustion, key, row.exhaustion_seconds)
            for model, (left, model_budget_state) in sorted(row.models.items()):
                add_namespace_sample(model_remaining, key, left, model=model)
                for candidate in BUDGET_STATES:
                    if candidate != "unlimited":  # a model's budget always has an amount
                        spent = 1.0 if candidate == model_budget_state else 0.0
                        add_namespace_sample(model_state, key, spent, model=model, state=candidate)
        yield from (budget, used, remaining, state, burn_rate, exhaustion, model_remaining, model_state)


class PoolCollector(Collector):
    """Each pool's figures, as last read: (pool, budget + grants, used, state)."""

    def __init__(self) -> None:
        self.rows: Sequence[tuple[str, float, float, str]] = ()

    def collect(self) -> Iterator[Metric]:
        budget = GaugeMetricFamily(
            "timekeeper_pool_budget_gpu_minutes", "A pool's budget plus its members' grants", labels=["pool"]
        )
        used = GaugeMetricFamily(
            "timekeeper_pool_used_gpu_minutes",
            "GPU-minutes a pool's members used this period",
            labels=["pool"],
        )
        state = GaugeMetricFamily("timekeeper_pool_state", "1 for the pool's state", labels=["pool", "state"])
        for pool, available, spent, current in self.rows:
            budget.add_metric([pool], available)
            used.add_metric([pool], spent)
            for candidate in BUDGET_STATES:
                state.add_metric([pool, candidate], 1.0 if candidate == current else 0.0)
        yield from (budget, used, state)


class IdleCollector(Collector):
    """The idle report per namespace, as last read (absent: none idle)."""

    def __init__(self) -> None:
        self.rows: Sequence[tuple[str, int, float]] = ()

    def collect(self) -> Iterator[Metric]:
        pods = GaugeMetricFamily(
            "timekeeper_idle_gpu_pods",
            "Running pods holding GPUs at least idle_after with utilisation below the idle threshold",
        )
        gpus = GaugeMetricFamily("timekeeper_idle_gpus", "GPUs (shares summed) held by those idle pods")
        for namespace, count, shares in self.rows:
            add_namespace_sample(pods, namespace, count)
            add_namespace_sample(gpus, namespace, shares)
        yield from (pods, gpus)


class UnweightedPodsCollector(Collector):
    """The running pods of no known GPU model per namespace, as last read."""

    def __init__(self) -> None:
        self.counts: Mapping[str, int] = {}

    def collect(self) -> Iterator[Metric]:
        pods = GaugeMetricFamily(
            "timekeeper_pods_without_gpu_model",
            "Running pods whose GPU model is not known (charged at weight 1), set at scrape",
        )
        for namespace, count in sorted(self.counts.items()):
            add_namespace_sample(pods, namespace, count)
        yield pods


class PodWatchCollector(Collector):
    """Running GPU pods and those whose sidecar has gone silent, per namespace, as the leader's last
    reconcile pass found them (only its pod watch can tell the two apart); a follower exports no samples."""

    def __init__(self) -> None:
        # namespace key -> (running GPU pods, of which silent); None: not leading, or no pass yet. A hub
        # reconciles each cluster of its fleet in a pass of its own, and each shows its own cluster's.
        self.counts: dict[str, tuple[int, int]] | None = None

    def show(self, cluster: str | None, counts: dict[str, tuple[int, int]]) -> None:
        """`cluster`'s counts (by namespace key) in place of those its last pass showed."""
        self.counts = self._others(cluster) | counts

    def forget(self, cluster: str | None) -> None:
        """`cluster` no longer counted here (not leading); no samples at all once no cluster is."""
        self.counts = self._others(cluster) or None

    def _others(self, cluster: str | None) -> dict[str, tuple[int, int]]:
        return {key: count for key, count in (self.counts or {}).items() if cluster_of(key) != cluster}

    def collect(self) -> Iterator[Metric]:
        running = GaugeMetricFamily(
            "timekeeper_running_gpu_pods",
            "GPU pods the API server shows running (the scheduler leader's last reconcile pass)",
        )
        silent = GaugeMetricFamily(
            "timekeeper_silent_gpu_pods",
            "Running GPU pods whose sidecar sent no report for TIMEKEEPER_SIDECAR_SILENT_AFTER_SECONDS",
        )
        for namespace, (count, quiet) in sorted((self.counts or {}).items()):
            add_namespace_sample(running, namespace, count)
            add_namespace_sample(silent, namespace, quiet)
        yield from (running, silent)


class Metrics:
    """The process's counters render whatever the database does; the database's figures are those of the
    last successful read (`show`), with their age, so an outage shows as `timekeeper_database_up 0`
    beside the last known budgets rather than as a failed scrape."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reports = Counter(
            "timekeeper_reports",
            "Reports by result (charged, duplicate, rejected)",
            ["result"],
            registry=self.registry,
        )
        # No labels (per-namespace series would show which namespaces misreport to every scraper); a
        # counter without labels is exported at 0 from the start.
        self.share_mismatches = Counter(
            "timekeeper_report_share_mismatches",
            "Reports that stated another GPU share than the one their pod was admitted at (charged at "
            "the admitted share)",
            registry=self.registry,
        )
        start_at_zero(self.reports, result=REPORT_RESULTS)
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
        start_at_zero(self.batch_failures, reason=BATCH_FAILURE_REASONS)
        self.outages = OutageWatch(self.registry)
        self.namespaces = NamespaceCollector()
        self.registry.register(self.namespaces)
        self.idle = IdleCollector()
        self.registry.register(self.idle)
        self.unweighted_pods = UnweightedPodsCollector()
        self.registry.register(self.unweighted_pods)
        self.pools = PoolCollector()
        self.registry.register(self.pools)
        self.registry.register(CONNECTIONS_REFUSED)
        self.read_at: float | None = None  # time.monotonic() of the last successful read
        Gauge(
            "timekeeper_budget_metrics_age_seconds",
            "Seconds since the per-namespace and pool series were read from the database (-1: never)",
            registry=self.registry,
        ).set_function(lambda: -1.0 if self.read_at is None else time.monotonic() - self.read_at)

    def show(self, readout: BudgetReadout) -> None:
        """Replace the database's figures by a fresh read, all at once."""
        self.namespaces.rows = readout.namespaces
        self.pools.rows = readout.pools
        self.idle.rows = readout.idle
        self.unweighted_pods.counts = readout.unweighted_pods
        self.read_at = time.monotonic()


# The app's Metrics, in its context (timekeeper/context.py).
METRICS: Slot[Metrics] = Slot("metrics")


class GitOpsMetrics(Collector):
    """The GPUBudget sync's (timekeeper/gitops): collected through the periodic runner, which registers
    it while it runs (the sync runs on the leader; a follower exports zeros). Each by `cluster`, whose
    objects they are: "" the hub's own, else a member's name (docs/fleet.md)."""

    def __init__(self, clusters: Iterable[str] = (LOCAL_CLUSTER_LABEL,)) -> None:
        clusters = tuple(clusters)
        self.passes = Counter(
            "timekeeper_gitops_passes",
            "GPUBudget sync passes by cluster and outcome (ok, error)",
            ["cluster", "outcome"],
            registry=None,
        )
        start_at_zero(self.passes, cluster=clusters, outcome=GITOPS_OUTCOMES)
        self.changes = Counter(
            "timekeeper_gitops_changes",
            "Budget changes the GPUBudget sync made: applied (a spec written), released (an object gone)",
            ["cluster", "action"],
            registry=None,
        )
        start_at_zero(self.changes, cluster=clusters, action=GITOPS_ACTIONS)
        self.not_ready = Gauge(
            "timekeeper_gitops_objects_not_ready",
            "GPUBudget and GPUBudgetDefault objects whose spec is not the budget in force (invalid, "
            "a second object in one namespace), by cluster",
            ["cluster"],
            registry=None,
        )
        for cluster in clusters:
            self.not_ready.labels(cluster=cluster)

    def collect(self) -> Iterator[Metric]:
        for metric in (self.passes, self.changes, self.not_ready):
            yield from metric.collect()


class DowngradeMetrics(Collector):
    """What the reconciler did to an exhausted namespace's running work (on the leader; a follower
    exports zeros): pods evicted, refused by a PodDisruptionBudget, deleted once the PDB's patience was
    spent, or deleted again to shorten a tenant's own long deletion grace; Kueue Workloads lowered by a
    pass or, as soon as they changed, by the Workload watch."""

    def __init__(self) -> None:
        self.pods = Counter(
            "timekeeper_downgraded_pods",
            "Downgrades of running GPU pods by outcome (evicted, blocked_by_pdb, deleted_past_pdb, "
            "grace_shortened)",
            ["outcome"],
            registry=None,
        )
        start_at_zero(self.pods, outcome=DOWNGRADE_OUTCOMES)
        self.kueue_lowered = Counter(
            "timekeeper_kueue_workloads_lowered",
            "Kueue Workloads lowered to the reduced priority, by trigger (pass, watch)",
            ["trigger"],
            registry=None,
        )
        start_at_zero(self.kueue_lowered, trigger=KUEUE_TRIGGERS)

    def collect(self) -> Iterator[Metric]:
        for metric in (self.pods, self.kueue_lowered):
            yield from metric.collect()
