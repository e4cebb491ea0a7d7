"""Namespace states and the admission snapshot the webhooks cache."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

import orjson
from sqlalchemy.ext.asyncio import AsyncSession

from gpuaccounting.admission_state import AdmissionState
from gpuaccounting.wire import BudgetState, format_timestamp
from timekeeper.domain.figures import NamespaceFigures
from timekeeper.domain.states import budget_state, figures_state, member_state, pool_state
from timekeeper.settings import Settings
from timekeeper.store.admission.repository import AdmissionRepository
from timekeeper.store.budgets.repository import BudgetRepository
from timekeeper.store.pools.repository import PoolRepository


def unpooled_states(figures: Sequence[NamespaceFigures]) -> dict[str, BudgetState] | None:
    """`AdmissionService.states` when no namespace of `figures` is in a pool: each budget's own rule,
    which reads nothing (None: some are, and their pools' figures are to be read)."""
    if any(f.config.pool is not None for f in figures):
        return None
    return {f.namespace: figures_state(f) for f in figures}


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


class AdmissionService:
    def __init__(self, session: AsyncSession, settings: Settings) -> None:
        self.repository = AdmissionRepository(session)
        self.budgets = BudgetRepository(session)
        self.pools = PoolRepository(session)
        self.settings = settings

    async def restate(self, now: datetime, namespaces: list[str] | None, *, config_changed: bool) -> None:
        """Recompute the namespaces' stored states (all known ones when None) from their figures now."""
        await self.record(await self.budgets.figures(now, namespaces), config_changed=config_changed, now=now)

    async def states(
        self, figures: Sequence[NamespaceFigures], now: datetime, *, lock: bool = False
    ) -> dict[str, BudgetState]:
        """The state the figures put each namespace in: its budget's rule, or for a pool member its pool's
        and its cap's (pools/rules.py), answered for every member of those pools (a charge to one moves
        them all). Pool members' totals are read here, in their pool's period current at `now`; with
        `lock`, after locking every state to be written (in name order, the order every writer takes
        them), so of two members charging at once the second sees the first's charge."""
        unpooled = unpooled_states(figures)
        if unpooled is not None:
            return unpooled
        states = {f.namespace: figures_state(f) for f in figures if f.config.pool is None}
        pools = sorted({f.config.pool for f in figures if f.config.pool is not None})
        members = await self.pools.members(pools, now)
        if lock:
            pooled = {member.namespace for listed in members.values() for member in listed}
            await self.repository.lock_states(sorted(pooled | {f.namespace for f in figures}))
            members = await self.pools.members(pools, now)
        configs = {pool.name: pool for pool in await self.pools.pools(pools)}
        for name, listed in members.items():
            pool = configs[name]
            state = pool_state(pool.budget_gpu_minutes, pool.warn_at_fraction, listed)
            states |= {
                member.namespace: member_state(state, member, pool.warn_at_fraction) for member in listed
            }
        return states

    async def record(
        self, figures: Sequence[NamespaceFigures], *, config_changed: bool, now: datetime
    ) -> tuple[dict[str, BudgetState], set[str]]:
        """The one restate path (ingest, the scheduler's jobs, budget and pool changes): store the state
        the figures put each namespace in (and every member of their pools, `states`), and bump the
        snapshot version when a state changed, or always when a configuration did. Answers the states and
        the namespaces whose state changed."""
        states = await self.states(figures, now, lock=True)
        changed = await self.repository.set_states(states)
        if changed or config_changed:
            await self.repository.bump_version()
        return states, changed

    async def snapshot_json(
        self,
        now: datetime,
        unchanged: Callable[[int], bool] = lambda version: False,
        cache: SnapshotCache | None = None,
        source: object = None,
    ) -> tuple[int, bytes | None]:
        """The snapshot's version and the gpuaccounting.admission_state.AdmissionState document under it,
        or None for the document when the caller already has that version (`unchanged`: it answers 304).
        With a `cache`, a version's document is built once (`generated_at` says when) and kept until the
        version moves.
        Reading writes nothing: the roll-over at midnight UTC (when every period begins) is the
        scheduler's `rollover` job's, which re-states every namespace. The entries are read after the
        version, so a change racing this read shows up under the next version rather than hiding under
        this one; the entries left out are those equal to the default entry built from the same read."""
        version, budget, warn_at_fraction = await self.repository.version_and_default()
        if unchanged(version):
            return version, None
        if cache is not None and (built := cache.get(source, version)) is not None:
            return version, built
        default_state = budget_state(budget, Decimal(0), Decimal(0), warn_at_fraction)
        policies, default_share, namespaces = await self.repository.snapshot(default_state)
        document: AdmissionState = {
            "version": version,
            "generated_at": format_timestamp(now),
            "priority_classes": {
                "in_budget": self.settings.in_budget_priority_class,
                "over_budget": self.settings.over_budget_priority_class,
            },
            "priority_policies": policies,
            "default": {"state": default_state, "max_gpu_share_per_pod": default_share, "priority_policy": 0},
            "namespaces": namespaces,
        }
        body = orjson.dumps(document)
        if cache is not None:
            cache.put(source, version, body)
        return version, body
