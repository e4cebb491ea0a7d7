"""The admission snapshot the webhooks cache, built from the stored states."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

import orjson
from sqlalchemy.ext.asyncio import AsyncSession

from gpuaccounting.admission_state import AdmissionSnapshot, NamespaceEntry, PriorityClassNames
from gpuaccounting.wire import format_timestamp
from timekeeper.budgets.states.models import BudgetEvent
from timekeeper.budgets.states.repository import StateRepository
from timekeeper.domain.clusters import in_cluster
from timekeeper.domain.states import budget_state
from timekeeper.settings import Settings


@dataclass
class _Built:
    source: object
    version: int
    body: bytes


@dataclass
class SnapshotCache:
    """The last snapshot document this replica built for each cluster (None: the local one), under its
    version. Every change bumps the version in its transaction, so a version's document never changes;
    `source` (the sessionmaker the version was read from) keeps another database's versions apart. A
    cluster's document holds only its namespaces, so each is built and kept apart; the version is the
    fleet's, so a change anywhere is a new version everywhere (a pool's state spans clusters)."""

    built: dict[str | None, _Built] = field(default_factory=dict)

    def get(self, source: object, version: int, cluster: str | None = None) -> bytes | None:
        found = self.built.get(cluster)
        if found is None or found.source is not source or found.version != version:
            return None
        return found.body

    def put(self, source: object, version: int, body: bytes, cluster: str | None = None) -> None:
        self.built[cluster] = _Built(source, version, body)


class SnapshotService:
    def __init__(self, session: AsyncSession, settings: Settings) -> None:
        self.repository = StateRepository(session)
        self.settings = settings

    async def snapshot_json(
        self,
        now: datetime,
        unchanged: Callable[[int], bool] = lambda version: False,
        cache: SnapshotCache | None = None,
        source: object = None,
        cluster: str | None = None,
    ) -> tuple[int, bytes | None]:
        """`cluster`'s snapshot (None: the local cluster's): its version and document (None when
        `unchanged(version)`: a 304), read after the version so a racing change shows under the next one;
        entries equal to the default are left out, and those of other clusters, the rest by bare namespace
        as that cluster's webhook knows them. Reading writes nothing. With a `cache`, a version's document
        is built once per cluster."""
        version, budget, warn_at_fraction = await self.repository.version_and_default()
        if unchanged(version):
            return version, None
        if cache is not None and (built := cache.get(source, version, cluster)) is not None:
            return version, built
        default_state = budget_state(budget, Decimal(0), Decimal(0), warn_at_fraction)
        policies, default_share, namespaces = await self.repository.snapshot(default_state)
        document = AdmissionSnapshot(
            version=version,
            generated_at=format_timestamp(now),
            priority_classes=PriorityClassNames(
                in_budget=self.settings.in_budget_priority_class,
                over_budget=self.settings.over_budget_priority_class,
            ),
            priority_policies=policies,
            default=NamespaceEntry(
                state=default_state, max_gpu_share_per_pod=default_share, priority_policy=0
            ),
            namespaces=in_cluster(namespaces, cluster),
        )
        body = orjson.dumps(document)
        if cache is not None:
            cache.put(source, version, body, cluster)
        return version, body

    async def events(
        self, namespace: str, since: datetime | None, limit: int, before_id: int | None
    ) -> Sequence[BudgetEvent]:
        """The namespace's state transitions, newest first; page with before_id."""
        return await self.repository.events(namespace, since, limit, before_id)
