"""The leader's count of running GPU pods per namespace, and of those whose sidecar has gone silent
(exported by PodWatchCollector, by namespace key: one collector shows every cluster's; only the leader's
counts are true, so a follower exports none)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from timekeeper.clock import Clock
from timekeeper.domain.clusters import namespace_key
from timekeeper.metrics import PodWatchCollector
from timekeeper.reconcile.decisions import holds_gpus
from timekeeper.reconcile.pods import PodRegistry, TrackedPod
from timekeeper.reconcile.result import PassResult
from timekeeper.settings import Settings

log = logging.getLogger(__name__)


class PodCensus:
    """Counts the registry's pods each pass; each pod is logged once when it turns silent."""

    def __init__(
        self,
        registry: PodRegistry,
        settings: Settings,
        clock: Clock,
        metrics: PodWatchCollector,
        cluster: str | None = None,
    ) -> None:
        self.registry = registry
        self.settings = settings
        self.clock = clock
        self.metrics = metrics
        self.cluster = cluster  # whose pods the registry holds (None: the local cluster)
        self._silent: set[str] = set()  # uids found silent by the last pass (logged once per silence)

    def forget(self) -> None:
        """Not leading (or not yet passed): no pod counts are exported, so only the leader's show."""
        self.metrics.forget(self.cluster)
        self._silent = set()

    def count(
        self, reports: dict[str, tuple[datetime, bool]], claim_holders: set[str], result: PassResult
    ) -> None:
        """Running GPU pods per namespace, and those with our sidecar whose last report (their start when
        none came) is older than `sidecar_silent_after_seconds`; a sidecar that sent its final report has
        finished, not stopped. Each pod is logged once when it turns silent."""
        now = self.clock.now()
        threshold = timedelta(seconds=self.settings.sidecar_silent_after_seconds)
        counts: dict[str, tuple[int, int]] = {}
        silent: dict[str, tuple[TrackedPod, datetime]] = {}
        for pod in self.registry.pods():
            if not pod.running or not holds_gpus(pod, claim_holders):
                continue
            info = pod.info
            key = namespace_key(self.cluster, info.namespace)
            running, quiet = counts.get(key, (0, 0))
            last_report, final = reports.get(info.uid, (info.started_at, False))
            if pod.sidecar and not final and last_report is not None and now - last_report > threshold:
                silent[info.uid] = (pod, last_report)
                quiet += 1
            counts[key] = (running + 1, quiet)
        for pod, last_report in sorted(
            (silent[uid] for uid in silent.keys() - self._silent),
            key=lambda item: (item[0].info.namespace, item[0].info.name),
        ):
            log.warning(
                "sidecar_silent",
                extra={
                    "namespace": namespace_key(self.cluster, pod.info.namespace),
                    "pod": pod.info.name,
                    "last_report_at": last_report.isoformat(),
                },
            )
        self._silent = set(silent)
        self.metrics.show(self.cluster, counts)
        result.silent = sorted((pod.info.namespace, pod.info.name) for pod, _ in silent.values())
