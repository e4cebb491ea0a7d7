"""SQL the reconciler needs beyond the report path: which pods have time not yet charged, keeping a
charge by the pass from looking like a report, closing ended pods at their real end, the namespaces'
states, which exhausted namespaces evict their running pods, and concurrent limits."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from gpuaccounting.wire import BudgetState

# Ended: no longer running, closed at its real end (whatever the close-out job set on noticing silence).
_CLOSE_AT = sa.text(
    "UPDATE pod_coverage SET final = true, closed_at = :ended_at "
    "WHERE pod_uid = :pod_uid AND NOT (final AND closed_at IS NOT DISTINCT FROM :ended_at)"
)
_UNCOVERED = sa.text(
    "SELECT c.uid FROM unnest(CAST(:uids AS text[]), CAST(:starts AS timestamptz[]), "
    "CAST(:ends AS timestamptz[])) AS c(uid, lower_bound, upper_bound) "
    "LEFT JOIN pod_coverage p ON p.pod_uid = c.uid "
    "WHERE NOT isempty(tstzmultirange(tstzrange(c.lower_bound, c.upper_bound)) "
    "- COALESCE(p.covered, '{}'::tstzmultirange))"
)
_LIMITS = sa.text(
    "SELECT n.namespace, CASE WHEN b.namespace IS NULL THEN d.concurrent_gpu_limit "
    "ELSE b.concurrent_gpu_limit END AS concurrent_gpu_limit "
    "FROM (SELECT namespace FROM namespace_status UNION SELECT namespace FROM namespace_budgets "
    "UNION SELECT unnest(CAST(:extra AS text[]))) AS n(namespace) "
    "LEFT JOIN namespace_budgets b ON b.namespace = n.namespace CROSS JOIN default_budget d"
)

# Exhausted namespaces whose budget (their own, else the default) says `evict`, with the classes their
# priority policy exempts.
_EVICTING = sa.text(
    "SELECT s.namespace, coalesce(b.priority_policy, d.priority_policy) -> 'exempt_classes' AS exempt "
    "FROM namespace_status s CROSS JOIN default_budget d "
    "LEFT JOIN namespace_budgets b ON b.namespace = s.namespace "
    "WHERE s.state = 'exhausted' AND coalesce(b.running_pod_action, d.running_pod_action) = 'evict'"
)


class ReconcileRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def close_at(self, pod_uid: str, ended_at: datetime) -> None:
        """The pod ended: `final`, closed at its real end (overriding a close-out's time of noticing)."""
        await self.session.execute(_CLOSE_AT, {"pod_uid": pod_uid, "ended_at": ended_at})

    async def with_uncovered_time(self, spans: Iterable[tuple[str, datetime, datetime]]) -> set[str]:
        """The pod uids whose span holds time no report (nor earlier pass) has charged."""
        spans = list(spans)
        if not spans:
            return set()
        uids, starts, ends = (list(column) for column in zip(*spans, strict=True))
        result = await self.session.execute(_UNCOVERED, {"uids": uids, "starts": starts, "ends": ends})
        return set(result.scalars())

    async def states(self) -> dict[str, BudgetState]:
        result = await self.session.execute(sa.text("SELECT namespace, state FROM namespace_status"))
        return {row.namespace: row.state for row in result}

    async def evicting(self) -> dict[str, frozenset[str]]:
        """The namespaces whose running GPU pods are to be evicted, each with its exempt classes."""
        result = await self.session.execute(_EVICTING)
        return {row.namespace: frozenset(row.exempt) for row in result}

    async def concurrent_limits(self, extra_namespaces: Iterable[str]) -> dict[str, Decimal | None]:
        """Each known namespace's concurrent GPU limit: its own budget's, else the default's."""
        result = await self.session.execute(_LIMITS, {"extra": sorted(set(extra_namespaces))})
        return {row.namespace: row.concurrent_gpu_limit for row in result}
