"""The admission snapshot the webhooks cache, built from the stored states."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

import orjson
from sqlalchemy.ext.asyncio import AsyncSession

from gpuaccounting.admission_state import AdmissionSnapshot, NamespaceEntry, PriorityClassNames
from gpuaccounting.wire import format_timestamp
from timekeeper.domain.states import budget_state
from timekeeper.settings import Settings
from timekeeper.store.states.models import BudgetEvent
from timekeeper.store.states.repository import StateRepository


@dataclass
class SnapshotCache:
    """The last snapshot document this replica built, under its version. Every change to what the
    snapshot holds bumps the version in the same transaction (the ETag's 304 relies on that already), so
    the document of a version never changes: the webhooks that poll after a change all get the bytes
    built for the first of them. `source` is what the version was read from (the app's sessionmaker):
    another database's version numbers mean other documents."""

    source: object = None
    version: int | None = None
    body: bytes = b""

    def get(self, source: object, version: int) -> bytes | None:
        return self.body if self.source is source and self.version == version else None

    def put(self, source: object, version: int, body: bytes) -> None:
        self.source, self.version, self.body = source, version, body


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
    ) -> tuple[int, bytes | None]:
        """The snapshot's version and the gpuaccounting.admission_state.AdmissionSnapshot document under it,
        or None for the document when the caller already has that version (`unchanged`: it answers 304).
        With a `cache`, a version's document is built once (`generated_at` says when) and kept until the
        version moves.
        Reading writes nothing: the roll-over at midnight UTC (when every period begins) is the
        scheduler's `rollover` job's, which refreshes every namespace's state. The entries are read after the
        version, so a change racing this read shows up under the next version rather than hiding under
        this one; the entries left out are those equal to the default entry built from the same read."""
        version, budget, warn_at_fraction = await self.repository.version_and_default()
        if unchanged(version):
            return version, None
        if cache is not None and (built := cache.get(source, version)) is not None:
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
            namespaces=namespaces,
        )
        body = orjson.dumps(document)
        if cache is not None:
            cache.put(source, version, body)
        return version, body

    async def events(
        self, namespace: str, since: datetime | None, limit: int, before_id: int | None
    ) -> Sequence[BudgetEvent]:
        """The namespace's state transitions, newest first; page with before_id."""
        return await self.repository.events(namespace, since, limit, before_id)
