"""SQL for pools: the pools and their listed members, and each member's totals in its pool's current
period (a member's running totals are kept in its pool's period kind: budgets/repository.py)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from timekeeper.auth.base import Principal
from timekeeper.budgets.pools.models import (
    LOCAL_KEY_SQL,
    MEMBERSHIP_SQL,
    BudgetPool,
    NamespaceLabels,
    PoolMember,
)
from timekeeper.domain.figures import MemberFigures
from timekeeper.domain.periods import PeriodKind, current_period_starts

# The members of the given pools (listed, or chosen by a selector and listed nowhere), each with its
# running totals of the pool's current period. A member cluster's namespace's grants count in no pool
# (docs/fleet.md#pools-across-clusters): that cluster's principals wrote them; a pool is the hub's admins'.
_MEMBERS = sa.text(
    f"""
    SELECT pm.pool, pm.namespace, pm.cap_gpu_minutes,
           EXISTS (SELECT 1 FROM budget_pool_members m WHERE m.namespace = pm.namespace) AS listed,
           coalesce(t.used_gpu_minutes, 0) AS used,
           CASE WHEN {LOCAL_KEY_SQL.format(key="pm.namespace")} THEN coalesce(t.granted_gpu_minutes, 0)
                ELSE 0 END AS granted
    FROM {MEMBERSHIP_SQL} pm
    JOIN budget_pools pl ON pl.name = pm.pool
    LEFT JOIN usage_totals t ON t.namespace = pm.namespace AND t.period_kind = pl.period
        AND t.period_start = CASE pl.period WHEN 'daily' THEN :daily WHEN 'weekly' THEN :weekly
                                            WHEN 'monthly' THEN :monthly ELSE :none END
    WHERE pm.pool = ANY(CAST(:pools AS text[]))
    ORDER BY pm.pool, pm.namespace
    """
)


class PoolRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def pools(self, names: Sequence[str] | None = None) -> list[BudgetPool]:
        """The named pools (all when None), by name."""
        query = sa.select(BudgetPool).order_by(BudgetPool.name)
        if names is not None:
            query = query.where(BudgetPool.name.in_(names))
        return list((await self.session.scalars(query)).all())

    async def pool_for_update(self, name: str) -> BudgetPool | None:
        return (
            await self.session.scalars(sa.select(BudgetPool).where(BudgetPool.name == name).with_for_update())
        ).first()

    async def members(self, pools: Sequence[str], now: datetime) -> dict[str, list[MemberFigures]]:
        """Each pool's members with their totals of the pool's period current at `now`."""
        starts = {kind.value: start for kind, start in current_period_starts(now).items()}
        result = await self.session.execute(_MEMBERS, {**starts, "pools": list(pools)})
        members: dict[str, list[MemberFigures]] = {pool: [] for pool in pools}
        for row in result:
            members[row.pool].append(
                MemberFigures(row.namespace, row.cap_gpu_minutes, row.listed, row.used, row.granted)
            )
        return members

    async def listed_elsewhere(self, pool: str, namespaces: Sequence[str]) -> dict[str, str]:
        """Those of the namespaces listed in another pool, with that pool."""
        result = await self.session.execute(
            sa.select(PoolMember.namespace, PoolMember.pool).where(
                PoolMember.namespace.in_(namespaces), PoolMember.pool != pool
            )
        )
        return dict(result.tuples().all())

    async def put(
        self,
        name: str,
        values: dict[str, Any],
        members: dict[str, Decimal | None],
        actor: Principal,
        now: datetime,
    ) -> None:
        """Create or replace the pool and its listed members."""
        selector = values["namespace_selector"]
        statement = insert(BudgetPool).values(
            name=name,
            budget_gpu_minutes=values["budget_gpu_minutes"],
            period=values["period"],
            warn_at_fraction=values["warn_at_fraction"],
            namespace_selector=sa.null() if selector is None else selector,
            models=sa.null() if values["models"] is None else values["models"],
            model_policy=values["model_policy"],
            updated_at=now,
            updated_by=actor.name,
            updated_by_cluster=actor.cluster,
        )
        await self.session.execute(
            statement.on_conflict_do_update(
                index_elements=[BudgetPool.name],
                set_={
                    column: statement.excluded[column]
                    for column in (
                        "budget_gpu_minutes",
                        "period",
                        "warn_at_fraction",
                        "namespace_selector",
                        "models",
                        "model_policy",
                        "updated_at",
                        "updated_by",
                        "updated_by_cluster",
                    )
                },
            )
        )
        await self.session.execute(sa.delete(PoolMember).where(PoolMember.pool == name))
        if members:
            await self.session.execute(
                sa.insert(PoolMember).values(
                    [
                        {"namespace": ns, "pool": name, "cap_gpu_minutes": cap}
                        for ns, cap in sorted(members.items())
                    ]
                )
            )

    async def delete(self, name: str) -> None:
        await self.session.execute(sa.delete(BudgetPool).where(BudgetPool.name == name))

    async def listed(self, name: str) -> dict[str, Decimal | None]:
        result = await self.session.execute(
            sa.select(PoolMember.namespace, PoolMember.cap_gpu_minutes)
            .where(PoolMember.pool == name)
            .order_by(PoolMember.namespace)
        )
        return dict(result.tuples().all())

    async def labels(self) -> dict[str, dict[str, str]]:
        result = await self.session.execute(sa.select(NamespaceLabels.namespace, NamespaceLabels.labels))
        return dict(result.tuples().all())

    async def put_labels(
        self, labels: dict[str, dict[str, str]], now: datetime, gone: Sequence[str] = ()
    ) -> None:
        """The namespaces' labels as just listed, and the namespaces no longer there (`gone`) forgotten."""
        if gone:
            await self.session.execute(sa.delete(NamespaceLabels).where(NamespaceLabels.namespace.in_(gone)))
        if labels:
            statement = insert(NamespaceLabels).values(
                [{"namespace": ns, "labels": value, "seen_at": now} for ns, value in sorted(labels.items())]
            )
            await self.session.execute(
                statement.on_conflict_do_update(
                    index_elements=[NamespaceLabels.namespace],
                    set_={"labels": statement.excluded.labels, "seen_at": statement.excluded.seen_at},
                    where=NamespaceLabels.labels != statement.excluded.labels,
                )
            )


def period_kind(pool: BudgetPool) -> PeriodKind:
    return PeriodKind(pool.period)
