"""SQL the reconciler needs beyond the report path: which pods have time not yet charged, closing ended
pods at their real end, the namespaces' states, which exhausted namespaces evict their running pods or
lower their Kueue Workloads, and concurrent limits. Core statements on the models; the
coverage test stays PostgreSQL (multirange arithmetic has no Core spelling)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import InstrumentedAttribute

from gpuaccounting.wire import BudgetState
from timekeeper.budgets.models import DefaultBudget, NamespaceBudget
from timekeeper.budgets.states.models import NamespaceStatus
from timekeeper.domain.clusters import pod_key
from timekeeper.usage.models import PodCoverage

_UNCOVERED = sa.text(
    "SELECT c.n - 1 FROM unnest(CAST(:uids AS text[]), CAST(:starts AS timestamptz[]), "
    "CAST(:ends AS timestamptz[])) WITH ORDINALITY AS c(uid, lower_bound, upper_bound, n) "
    "LEFT JOIN pod_coverage p ON p.pod_uid = c.uid "
    "WHERE NOT isempty(tstzmultirange(tstzrange(c.lower_bound, c.upper_bound)) "
    "- COALESCE(p.covered, '{}'::tstzmultirange))"
)


class ReconcileRepository:
    """`cluster`: whose pods' (and claims') uids the methods take and answer (None: the local cluster's);
    their rows are stored under their pod keys (timekeeper/domain/clusters.py, `pod_key`), as their
    sidecars' reports are, so a member's uid never names another cluster's pod."""

    def __init__(self, session: AsyncSession, cluster: str | None = None) -> None:
        self.session = session
        self.cluster = cluster

    def _keys(self, uids: Iterable[str]) -> dict[str, str]:
        """pod key -> uid."""
        return {pod_key(self.cluster, uid): uid for uid in uids}

    async def close_at(self, pod_uid: str, ended_at: datetime) -> None:
        """The pod ended: `final`, closed at its real end (overriding a close-out's time of noticing)."""
        already = sa.and_(PodCoverage.final, PodCoverage.closed_at.is_not_distinct_from(ended_at))
        await self.session.execute(
            sa.update(PodCoverage)
            .where(PodCoverage.pod_uid == pod_key(self.cluster, pod_uid), sa.not_(already))
            .values(final=True, closed_at=ended_at)
            .execution_options(synchronize_session=False)
        )

    async def with_uncovered_time(self, spans: Iterable[tuple[str, datetime, datetime]]) -> set[str]:
        """The pod uids whose span holds time no report (nor earlier pass) has charged."""
        spans = list(spans)
        return {spans[index][0] for index in await self.uncovered_spans(spans)}

    async def uncovered_spans(self, spans: Sequence[tuple[str, datetime, datetime]]) -> set[int]:
        """The positions of the (pod uid, start, end) spans holding time not charged yet."""
        if not spans:
            return set()
        uids, starts, ends = (list(column) for column in zip(*spans, strict=True))
        keys = [pod_key(self.cluster, uid) for uid in uids]
        result = await self.session.execute(_UNCOVERED, {"uids": keys, "starts": starts, "ends": ends})
        return set(result.scalars())

    async def sidecar_reports(self, uids: Iterable[str]) -> dict[str, tuple[datetime, bool]]:
        """Each pod's last sign of life from its sidecar and whether it sent its final report, for the
        pods that have a coverage row (a pod without one has never reported nor been charged)."""
        wanted = self._keys(uids)
        if not wanted:
            return {}
        result = await self.session.execute(
            sa.select(PodCoverage.pod_uid, PodCoverage.last_report_at, PodCoverage.final).where(
                PodCoverage.pod_uid == sa.any_(sa.literal(sorted(wanted), ARRAY(sa.Text)))
            )
        )
        return {wanted[row.pod_uid]: (row.last_report_at, row.final) for row in result}

    async def record_models(self, models: Mapping[str, str]) -> set[str]:
        """Records each pod's GPU model on its coverage row unless one is known already (the first source
        to tell wins); answers the pods whose row now holds a model."""
        return await self._record_first(PodCoverage.gpu_model, models)

    async def record_admitted_shares(self, shares: Mapping[str, Decimal]) -> set[str]:
        """Records each pod's admitted share on its coverage row unless one is known already; answers the
        pods whose row now holds one (a pod without a row yet has never reported nor been charged)."""
        return await self._record_first(PodCoverage.admitted_share, shares)

    async def record_workloads(self, workloads: Mapping[str, str]) -> set[str]:
        """Records each pod's workload on its coverage row unless one is known already; answers the pods
        whose row now holds one."""
        return await self._record_first(PodCoverage.workload, workloads)

    async def _record_first(self, column: InstrumentedAttribute[Any], values: Mapping[str, Any]) -> set[str]:
        """`column` of each pod's coverage row set to its value unless it holds one already."""
        keys = self._keys(values)
        given = sa.values(sa.column("pod_uid", sa.Text), sa.column("value", column.type), name="given").data(
            sorted((key, values[uid]) for key, uid in keys.items())
        )
        result = await self.session.execute(
            sa.update(PodCoverage)
            .where(PodCoverage.pod_uid == given.c.pod_uid)
            .values({column.key: sa.func.coalesce(column, given.c.value)})
            .returning(PodCoverage.pod_uid)
            .execution_options(synchronize_session=False)
        )
        return {keys[key] for key in result.scalars()}

    async def states(self) -> dict[str, BudgetState]:
        result = await self.session.execute(sa.select(NamespaceStatus.namespace, NamespaceStatus.state))
        return {row.namespace: row.state for row in result}

    async def evicting(self) -> dict[str, frozenset[str]]:
        """The exhausted namespaces whose budget (their own, else the default) says `evict`, each with the
        classes its priority policy exempts."""
        policy = sa.func.coalesce(NamespaceBudget.priority_policy, DefaultBudget.priority_policy)
        action = sa.func.coalesce(NamespaceBudget.running_pod_action, DefaultBudget.running_pod_action)
        result = await self.session.execute(
            sa.select(NamespaceStatus.namespace, policy["exempt_classes"].label("exempt"))
            .select_from(NamespaceStatus)
            .outerjoin(NamespaceBudget, NamespaceBudget.namespace == NamespaceStatus.namespace)
            .join(DefaultBudget, sa.true())
            .where(NamespaceStatus.state == "exhausted", action == "evict")
        )
        return {row.namespace: frozenset(row.exempt) for row in result}

    async def kueue_policies(self, namespaces: Iterable[str]) -> dict[str, tuple[bool, dict[str, Any]]]:
        """Every exhausted namespace and each of `namespaces`: whether its Workloads are lowered now (its
        effective action is `kueue`), and its effective priority policy (its own budget's, else the
        default's)."""
        extra = sa.literal(sorted(set(namespaces)), ARRAY(sa.Text))
        names = sa.union(
            sa.select(NamespaceStatus.namespace).where(NamespaceStatus.state == "exhausted"),
            sa.select(sa.func.unnest(extra)),
        ).subquery("names")
        policy = sa.func.coalesce(NamespaceBudget.priority_policy, DefaultBudget.priority_policy)
        action = sa.func.coalesce(NamespaceBudget.running_pod_action, DefaultBudget.running_pod_action)
        result = await self.session.execute(
            sa.select(
                names.c.namespace,
                sa.and_(NamespaceStatus.state == "exhausted", action == "kueue").label("lowering"),
                policy.label("policy"),
            )
            .select_from(names)
            .outerjoin(NamespaceStatus, NamespaceStatus.namespace == names.c.namespace)
            .outerjoin(NamespaceBudget, NamespaceBudget.namespace == names.c.namespace)
            .join(DefaultBudget, sa.true())
        )
        return {row.namespace: (bool(row.lowering), row.policy) for row in result}

    async def concurrent_limits(self, extra_namespaces: Iterable[str]) -> dict[str, Decimal | None]:
        """Each known namespace's concurrent GPU limit (the known ones and `extra_namespaces`): its own
        budget's, else the default's."""
        extra = sa.literal(sorted(set(extra_namespaces)), ARRAY(sa.Text))
        names = sa.union(
            sa.select(NamespaceStatus.namespace),
            sa.select(NamespaceBudget.namespace),
            sa.select(sa.func.unnest(extra)),
        ).subquery("names")
        own = NamespaceBudget.namespace.is_not(None)
        limit = sa.case((own, NamespaceBudget.concurrent_gpu_limit), else_=DefaultBudget.concurrent_gpu_limit)
        result = await self.session.execute(
            sa.select(names.c.namespace, limit.label("concurrent_gpu_limit"))
            .select_from(names)
            .outerjoin(NamespaceBudget, NamespaceBudget.namespace == names.c.namespace)
            .join(DefaultBudget, sa.true())
        )
        return {row.namespace: row.concurrent_gpu_limit for row in result}
