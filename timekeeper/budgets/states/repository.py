"""SQL for the namespaces' stored states and the admission snapshot's version."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gpuaccounting.admission_state import NamespaceEntry, PriorityPolicy
from gpuaccounting.wire import BudgetState
from timekeeper.budgets.pools.models import MEMBERSHIP_SQL
from timekeeper.budgets.states.models import AdmissionVersion, BudgetEvent, NamespaceStatus
from timekeeper.db.locks import by_namespace, in_lock_order

# Inserts a namespace on first sight; touches an existing row only when its state really changes, and
# then reports it (RETURNING yields a row for an insert or a real update, none otherwise). Two arrays,
# unnested: one statement of constant size whether a report stores one namespace's state or a sweep 10,000.
_SET_STATES = sa.text(
    "INSERT INTO namespace_status (namespace, state, model_states) "
    "SELECT * FROM unnest(CAST(:namespaces AS text[]), CAST(:states AS text[]), "
    "CAST(:model_states AS jsonb[])) "
    "ON CONFLICT (namespace) DO UPDATE SET state = excluded.state, model_states = excluded.model_states "
    "WHERE namespace_status.state <> excluded.state "
    "OR namespace_status.model_states <> excluded.model_states RETURNING namespace"
)
# The snapshot's rows (gpuaccounting.admission_state), in one statement. A namespace's resolved policy is
# the default's (index 0) unless its own budget row sets a different one; those few distinct policies get
# the indexes from 1, so the 10,000 status rows only join the small budgets table. First the policies
# (namespace NULL; index 0's row carries the default's per-pod cap), then the namespaces whose entry
# differs from the default's, whose state is `:default_state` (the default budget's with nothing used), or
# that has an exhausted GPU model or steers (such an entry carries its exhausted models, sorted, and its
# model policy: its pool's, else its own budget's, else the default's; other entries leave both out).
_SNAPSHOT = sa.text(
    f"""
    WITH own_policies AS (
        SELECT p.policy, CAST(row_number() OVER (ORDER BY p.policy) AS integer) AS id
        FROM (SELECT DISTINCT b.priority_policy AS policy FROM namespace_budgets b
              WHERE b.priority_policy <> (SELECT priority_policy FROM default_budget)) AS p
    ), default_share AS (
        SELECT CAST(max_gpu_share_per_pod AS float8) AS share FROM default_budget
    ), entries AS (
        SELECT s.namespace, s.state,
            CASE WHEN b.namespace IS NULL THEN (SELECT share FROM default_share)
                 ELSE CAST(b.max_gpu_share_per_pod AS float8) END AS share,
            coalesce(p.id, 0) AS policy,
            ARRAY(SELECT m.key FROM jsonb_each_text(s.model_states) AS m WHERE m.value = 'exhausted'
                  ORDER BY m.key COLLATE "C") AS exhausted_models,
            coalesce(pl.model_policy, b.model_policy, d.model_policy) AS model_policy
        FROM namespace_status s
        CROSS JOIN default_budget d
        LEFT JOIN namespace_budgets b ON b.namespace = s.namespace
        LEFT JOIN own_policies p ON p.policy = b.priority_policy
        LEFT JOIN {MEMBERSHIP_SQL} pm ON pm.namespace = s.namespace
        LEFT JOIN budget_pools pl ON pl.name = pm.pool
    )
    SELECT NULL AS namespace, NULL AS state, (SELECT share FROM default_share) AS share, 0 AS policy,
        priority_policy AS document, CAST(NULL AS text[]) AS exhausted_models, NULL AS model_policy
    FROM default_budget
    UNION ALL SELECT NULL, NULL, NULL, id, policy, NULL, NULL FROM own_policies
    UNION ALL SELECT namespace, state, share, policy, NULL, exhausted_models, model_policy FROM entries
    WHERE NOT (state = :default_state AND policy = 0
               AND share IS NOT DISTINCT FROM (SELECT share FROM default_share)
               AND cardinality(exhausted_models) = 0 AND model_policy = 'reduce')
    """
)
# What a poll needs first: the version (a 304 needs nothing else) and the default budget, whose state with
# nothing used is the snapshot's default entry's.
_VERSION_AND_DEFAULT = sa.text(
    "SELECT v.version, d.budget_gpu_minutes, d.warn_at_fraction FROM admission_version v, default_budget d"
)


async def known_namespaces(sessions: async_sessionmaker[AsyncSession]) -> list[str]:
    """Every namespace the timekeeper has state for: what `GET /namespaces` lists for a cluster-wide
    reader (BudgetRepository.figures without a list)."""
    async with sessions() as session:
        return list(await session.scalars(sa.select(NamespaceStatus.namespace)))


class StateRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def set_states(
        self, states: dict[str, BudgetState], models: Mapping[str, Mapping[str, BudgetState]]
    ) -> set[str]:
        """Record namespaces' states and their models' (in key order, the lock order); answers those new
        or changed (when any, the snapshot needs a new version)."""
        if not states:
            return set()
        names = in_lock_order(states)
        result = await self.session.execute(
            _SET_STATES,
            {
                "namespaces": names,
                "states": [states[name] for name in names],
                "model_states": [json.dumps(dict(models.get(name, {}))) for name in names],
            },
        )
        return set(result.scalars())

    async def lock_states(self, namespaces: list[str]) -> None:
        """Lock the namespaces' stored states, in the lock order."""
        await self.session.execute(
            sa.select(NamespaceStatus.namespace)
            .where(NamespaceStatus.namespace.in_(namespaces))
            .order_by(by_namespace(NamespaceStatus.namespace))
            .with_for_update()
        )

    async def stored_states(self, namespaces: list[str]) -> dict[str, BudgetState]:
        if not namespaces:
            return {}
        result = await self.session.execute(
            sa.select(NamespaceStatus.namespace, NamespaceStatus.state).where(
                NamespaceStatus.namespace.in_(namespaces)
            )
        )
        return {namespace: cast(BudgetState, state) for namespace, state in result.tuples()}

    async def bump_version(self) -> int:
        """Called in the transaction that changed a state or a budget, so the new version and the change
        become visible together."""
        result = await self.session.execute(
            sa.update(AdmissionVersion)
            .values(version=AdmissionVersion.version + 1)
            .returning(AdmissionVersion.version)
        )
        return int(result.scalar_one())

    async def version_and_default(self) -> tuple[int, Decimal | None, Decimal]:
        """The snapshot version, and the default budget and warning fraction."""
        row = (await self.session.execute(_VERSION_AND_DEFAULT)).one()
        return int(row.version), row.budget_gpu_minutes, row.warn_at_fraction

    async def snapshot(
        self, default_state: BudgetState
    ) -> tuple[list[PriorityPolicy], float | None, dict[str, NamespaceEntry]]:
        """The distinct resolved policies (the default's first), the default's per-pod cap, and the
        entries of the namespaces whose entry differs from the default's (whose state is
        `default_state`), each naming its policy by index."""
        rows = await self.session.execute(_SNAPSHOT, {"default_state": default_state})
        policies: dict[int, PriorityPolicy] = {}
        default_share: float | None = None
        namespaces: dict[str, NamespaceEntry] = {}
        for namespace, state, share, policy, document, exhausted, model_policy in rows:
            if namespace is not None:
                entry: dict[str, Any] = {
                    "state": state,
                    "max_gpu_share_per_pod": share,
                    "priority_policy": policy,
                }
                if exhausted or model_policy != "reduce":  # absent: none exhausted, reduce
                    # NamespaceEntry's NotRequired keys (gpuaccounting/admission_state.py, #41's wire).
                    entry |= {"exhausted_models": list(exhausted), "model_policy": model_policy}
                namespaces[namespace] = cast(NamespaceEntry, entry)
            else:
                policies[policy] = document
                if policy == 0:
                    default_share = share
        return [policies[index] for index in range(len(policies))], default_share, namespaces

    async def events(
        self, namespace: str, since: datetime | None, limit: int, before_id: int | None
    ) -> Sequence[BudgetEvent]:
        """The namespace's state transitions, newest first; page with before_id."""
        query = (
            sa.select(BudgetEvent)
            .where(BudgetEvent.namespace == namespace)
            .order_by(BudgetEvent.id.desc())
            .limit(limit)
        )
        if since is not None:
            query = query.where(BudgetEvent.at >= since)
        if before_id is not None:
            query = query.where(BudgetEvent.id < before_id)
        return (await self.session.scalars(query)).all()
