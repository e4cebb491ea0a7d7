"""SQL for budgets, defaults, grants and the per-period running totals."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal
from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from timekeeper.budgets.burn import BURNED_SQL, MODEL_BURNED_SQL, window_parameters
from timekeeper.budgets.models import Grant
from timekeeper.budgets.pools.models import MEMBERSHIP_SQL, membership_sql
from timekeeper.db.lists import arity, array_parameters, array_sql
from timekeeper.domain.figures import BUDGET_FIELDS, BudgetConfig, NamespaceFigures
from timekeeper.domain.periods import PeriodKind, current_period_starts


def _config(row: Any) -> BudgetConfig:
    return BudgetConfig(
        budget_gpu_minutes=row.budget_gpu_minutes,
        period=PeriodKind(row.period),
        warn_at_fraction=row.warn_at_fraction,
        max_gpu_share_per_pod=row.max_gpu_share_per_pod,
        concurrent_gpu_limit=row.concurrent_gpu_limit,
        explicit=row.explicit,
        priority_policy=row.priority_policy,
        running_pod_action=row.running_pod_action,
        own_priority_policy=row.own_priority_policy,
        own_running_pod_action=row.own_running_pod_action,
        pool=row.pool,
        models=stored_models(row.models),
        model_policy=row.model_policy,
    )


def stored_models(document: dict[str, Any] | None) -> dict[str, Decimal]:
    """A `models` column (decimal strings, exact) as amounts; NULL: none."""
    return {} if document is None else {model: Decimal(amount) for model, amount in document.items()}


def models_document(models: dict[str, Decimal] | None) -> str | None:
    """Amounts as a `models` column stores them (NULL: none)."""
    if not models:
        return None
    return json.dumps({model: format(amount, "f") for model, amount in sorted(models.items())})


_COLUMNS = ", ".join(BUDGET_FIELDS)
_F = BUDGET_FIELDS


def _resolved(pooled: bool) -> str:
    """A namespace's effective budget from `b` (its own row, NULL columns when it has none) and `d` (the
    default): the budget fields come whole from one or the other; the policy fields each from the
    namespace's own row where set there (non-NULL), else from the default. `pooled`: from `pm`/`pl` too
    (its pool membership and pool, NULL columns when it is in none), whose period a member counts in."""
    period = "CASE WHEN b.namespace IS NULL THEN d.period ELSE b.period END"
    return ", ".join(
        [
            *(f"CASE WHEN b.namespace IS NULL THEN d.{f} ELSE b.{f} END AS {f}" for f in _F if f != "period"),
            f"coalesce(pl.period, {period}) AS period" if pooled else f"{period} AS period",
            "b.namespace IS NOT NULL AS explicit",
            "coalesce(b.priority_policy, d.priority_policy) AS priority_policy",
            "b.priority_policy IS NOT NULL AS own_priority_policy",
            "coalesce(b.running_pod_action, d.running_pod_action) AS running_pod_action",
            "b.running_pod_action IS NOT NULL AS own_running_pod_action",
            "pl.name AS pool" if pooled else "NULL AS pool",
            # A pool's models map governs its members, as its total does.
            *(
                f"CASE WHEN {'pl.name IS NOT NULL THEN pl.' + f + ' WHEN ' if pooled else ''}"
                f"b.namespace IS NULL THEN d.{f} ELSE b.{f} END AS {f}"
                for f in ("models", "model_policy")
            ),
        ]
    )


_RESOLVED = _resolved(pooled=True)
# The namespace `w.namespace`'s pool (pl) through its membership (pm), if any: looked up by key for each
# wanted namespace, or (_POOL_ALL, for every known namespace) joined with every member at once.
_POOL = (
    f"LEFT JOIN LATERAL {membership_sql('w.namespace')} pm ON true "
    "LEFT JOIN budget_pools pl ON pl.name = pm.pool"
)
_POOL_ALL = (
    f"LEFT JOIN {MEMBERSHIP_SQL} pm ON pm.namespace = w.namespace "
    "LEFT JOIN budget_pools pl ON pl.name = pm.pool"
)
_EFFECTIVE = sa.text(
    f"SELECT {_RESOLVED} FROM (SELECT CAST(:namespace AS text) AS namespace) w CROSS JOIN default_budget d "
    f"LEFT JOIN namespace_budgets b ON b.namespace = w.namespace {_POOL}"
)
# As stored, whatever pool the namespace is in.
_OWN = sa.text(
    f"SELECT {_resolved(pooled=False)} FROM default_budget d "
    "JOIN namespace_budgets b ON b.namespace = :namespace"
)
_DEFAULT = sa.text(
    f"SELECT {_COLUMNS}, false AS explicit, priority_policy, true AS own_priority_policy, "
    "running_pod_action, true AS own_running_pod_action, NULL AS pool, models, model_policy "
    "FROM default_budget"
)
_STORED = (*BUDGET_FIELDS, "priority_policy", "running_pod_action", "models", "model_policy")
_UPSERT_OWN = sa.text(
    f"INSERT INTO namespace_budgets (namespace, {', '.join(_STORED)}, updated_at, updated_by) "
    "VALUES (:namespace, :budget_gpu_minutes, :period, :warn_at_fraction, :max_gpu_share_per_pod, "
    ":concurrent_gpu_limit, CAST(:priority_policy AS jsonb), :running_pod_action, CAST(:models AS jsonb), "
    ":model_policy, :now, :actor) "
    "ON CONFLICT (namespace) DO UPDATE SET "
    + ", ".join(f"{field} = excluded.{field}" for field in (*_STORED, "updated_at", "updated_by"))
)
_UPDATE_DEFAULT = sa.text(
    "UPDATE default_budget SET "
    + ", ".join(f"{field} = :{field}" for field in BUDGET_FIELDS)
    + ", priority_policy = CAST(:priority_policy AS jsonb), running_pod_action = :running_pod_action"
    + ", models = CAST(:models AS jsonb), model_policy = :model_policy"
    + ", updated_at = :now, updated_by = :actor"
)


_PERIOD_START = (
    "CASE e.period WHEN 'daily' THEN :daily WHEN 'weekly' THEN :weekly WHEN 'monthly' THEN :monthly "
    "ELSE :none END"
)


# Each wanted namespace with its effective budget and the totals of the period it is in now; with `burn`
# (a join of BURNED_SQL as `u`), the GPU-minutes it burnt in the forecast's window too, for a budget read
# in one statement. Listed namespaces and every known one are two statements, not one with `:namespaces
# IS NULL` deciding at run time: a plan for any parameters would read every known namespace.
def _figures(wanted: str, pool: str, burn: str = "") -> sa.TextClause:
    return sa.text(
        f"""
        WITH wanted AS ({wanted}), effective AS (
            SELECT w.namespace, {_RESOLVED}
            FROM wanted w
            CROSS JOIN default_budget d
            LEFT JOIN namespace_budgets b ON b.namespace = w.namespace
            {pool}
        )
        SELECT e.*, coalesce(t.used_gpu_minutes, 0) AS used, coalesce(t.granted_gpu_minutes, 0) AS granted,
            mu.model_used {", coalesce(u.burned, 0) AS burned, mb.model_burned" if burn else ""}
        FROM effective e
        LEFT JOIN usage_totals t ON t.namespace = e.namespace AND t.period_kind = e.period
            AND t.period_start = {_PERIOD_START}
        LEFT JOIN LATERAL (
            SELECT jsonb_object_agg(mt.model, CAST(mt.used_gpu_minutes AS text)) AS model_used
            FROM usage_model_totals mt
            WHERE mt.namespace = e.namespace AND mt.period_kind = e.period
                AND mt.period_start = {_PERIOD_START}
        ) mu ON true
        {burn}
        {f"LEFT JOIN LATERAL ({MODEL_BURNED_SQL}) mb ON true" if burn else ""}
        ORDER BY e.namespace
        """
    )


@cache
def figures_of(arity: int | None, burn: bool = False) -> sa.TextClause:
    """The figures of exactly the listed namespaces, known or not (`:namespace`, bound as lists.arity
    says); with `burn`, each one's burn found by key."""
    wanted = f"SELECT DISTINCT unnest({array_sql('namespace', arity)}) AS namespace"
    burned = BURNED_SQL.format(namespaces="namespace = e.namespace AND")
    return _figures(wanted, _POOL, f"LEFT JOIN LATERAL ({burned}) u ON true" if burn else "")


# Of every known namespace; with the burn, every namespace's at once.
FIGURES_ALL = _figures("SELECT namespace FROM namespace_status", _POOL_ALL)
_STATUSES_ALL = _figures(
    "SELECT namespace FROM namespace_status",
    _POOL_ALL,
    f"LEFT JOIN ({BURNED_SQL.format(namespaces='')}) u ON u.namespace = e.namespace",
)
_TOTALS = sa.text(
    "SELECT used_gpu_minutes, granted_gpu_minutes FROM usage_totals "
    "WHERE namespace = :namespace AND period_kind = :kind AND period_start = :start"
)
_ADD_GRANTED = sa.text(
    "INSERT INTO usage_totals (namespace, period_kind, period_start, granted_gpu_minutes) "
    "VALUES (:namespace, :kind, :start, :amount) ON CONFLICT (namespace, period_kind, period_start) "
    "DO UPDATE SET granted_gpu_minutes = usage_totals.granted_gpu_minutes + excluded.granted_gpu_minutes"
)
# A period's granted total recomputed from the grants that still count (after one ended).
_REFRESH_GRANTED = sa.text(
    """
    INSERT INTO usage_totals (namespace, period_kind, period_start, granted_gpu_minutes)
    SELECT :namespace, :kind, :start, coalesce(sum(g.gpu_minutes), 0) FROM grants g
    WHERE g.namespace = :namespace AND g.granted_at >= :start AND g.ended_at IS NULL
      AND (CAST(:end AS timestamptz) IS NULL OR g.granted_at < :end)
    ON CONFLICT (namespace, period_kind, period_start)
    DO UPDATE SET granted_gpu_minutes = excluded.granted_gpu_minutes
    """
)
# Recompute a period's totals from the charged time in the history (usage_history: the pod-hours of
# usage/models.py UsagePodHour, where every charge lands as it is made, and the pod-days they are folded
# into) and the grants, for namespaces whose period kind just changed (their running total for the new
# kind may have missed charges made under the old one).
_REBUILD = sa.text(
    """
    INSERT INTO usage_totals (namespace, period_kind, period_start, used_gpu_minutes, granted_gpu_minutes)
    SELECT n.namespace, :kind, :start,
        coalesce((
            SELECT sum(round(h.charge_share * (
                SELECT coalesce(sum(gpu_weighted_seconds(m.name, r)), 0)
                FROM unnest(h.charged * tstzmultirange(tstzrange(:start, :end))) AS r) / 60, 9))
            FROM pod_coverage c JOIN usage_history(:start, :end) h ON h.pod_key = c.id
            LEFT JOIN usage_models m ON m.id = h.model_key
            WHERE c.namespace = n.namespace
        ), 0),
        coalesce((
            SELECT sum(g.gpu_minutes) FROM grants g
            WHERE g.namespace = n.namespace AND g.granted_at >= :start AND g.ended_at IS NULL
              AND (CAST(:end AS timestamptz) IS NULL OR g.granted_at < :end)
        ), 0)
    FROM unnest(CAST(:namespaces AS text[])) AS n(namespace)
    ON CONFLICT (namespace, period_kind, period_start) DO UPDATE
        SET used_gpu_minutes = excluded.used_gpu_minutes, granted_gpu_minutes = excluded.granted_gpu_minutes
    """
)
# The same for the per-model totals: raw GPU-minutes (the admitted share, no weight) per model known.
_CLEAR_MODELS = sa.text(
    "DELETE FROM usage_model_totals WHERE namespace = ANY(CAST(:namespaces AS text[])) "
    "AND period_kind = :kind AND period_start = :start"
)
_REBUILD_MODELS = sa.text(
    """
    WITH n AS (SELECT unnest(CAST(:namespaces AS text[])) AS namespace)
    INSERT INTO usage_model_totals (namespace, period_kind, period_start, model, used_gpu_minutes)
    SELECT c.namespace, :kind, :start, coalesce(m.name, ''), sum(round(h.gpu_share * (
            SELECT coalesce(sum(extract(epoch FROM upper(r) - lower(r))), 0)
            FROM unnest(h.charged * tstzmultirange(tstzrange(:start, :end))) AS r) / 60, 9))
    FROM n JOIN pod_coverage c ON c.namespace = n.namespace
    JOIN usage_history(:start, :end) h ON h.pod_key = c.id
    LEFT JOIN usage_models m ON m.id = h.model_key
    GROUP BY 1, 4
    """
)


def figures_parameters(now: datetime, namespaces: list[str] | None = None) -> dict[str, Any]:
    """A figures statement's parameters: the current period's start of every kind at `now`, and the
    listed namespaces (figures_of's)."""
    starts: dict[str, Any] = {kind.value: start for kind, start in current_period_starts(now).items()}
    return starts if namespaces is None else {**starts, **array_parameters("namespace", namespaces)}


def figures_query(now: datetime, namespaces: list[str] | None) -> tuple[sa.TextClause, dict[str, Any]]:
    """The figures statement of exactly the listed namespaces (every known one: None), with its
    parameters."""
    statement = FIGURES_ALL if namespaces is None else figures_of(arity(len(namespaces)))
    return statement, figures_parameters(now, namespaces)


def namespace_figures(row: Any) -> NamespaceFigures:
    """A row of a figures statement (figures_query)."""
    return NamespaceFigures(row.namespace, _config(row), row.used, row.granted, stored_models(row.model_used))


async def statuses(
    session: AsyncSession, now: datetime, burn_since: datetime, namespaces: list[str] | None = None
) -> tuple[list[NamespaceFigures], dict[str, Decimal], dict[str, dict[str, Decimal]]]:
    """The figures (`BudgetRepository.figures`), the GPU-minutes each namespace burnt since `burn_since`
    (the forecast's burn buckets) and the raw GPU-minutes each burnt per GPU model, in one statement."""
    statement = _STATUSES_ALL if namespaces is None else figures_of(arity(len(namespaces)), burn=True)
    parameters = {**figures_parameters(now, namespaces), **window_parameters(burn_since, now)}
    rows = (await session.execute(statement, parameters)).all()
    return (
        [namespace_figures(row) for row in rows],
        {row.namespace: row.burned for row in rows},
        {row.namespace: stored_models(row.model_burned) for row in rows},
    )


def _stored(values: dict[str, Any]) -> dict[str, Any]:
    policy = values["priority_policy"]
    return {
        **values,
        "priority_policy": None if policy is None else json.dumps(policy),
        "models": models_document(values["models"]),
    }


class BudgetRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def effective(self, namespace: str) -> BudgetConfig:
        return _config((await self.session.execute(_EFFECTIVE, {"namespace": namespace})).one())

    async def own(self, namespace: str) -> BudgetConfig | None:
        row = (await self.session.execute(_OWN, {"namespace": namespace})).one_or_none()
        return None if row is None else _config(row)

    async def default(self) -> BudgetConfig:
        return _config((await self.session.execute(_DEFAULT)).one())

    async def put_own(self, namespace: str, values: dict[str, Any], actor: str, now: datetime) -> None:
        """`values`: the budget fields, and the policy fields as stored (None: follow the default)."""
        await self.session.execute(
            _UPSERT_OWN, {**_stored(values), "namespace": namespace, "actor": actor, "now": now}
        )

    async def delete_own(self, namespace: str) -> None:
        await self.session.execute(
            sa.text("DELETE FROM namespace_budgets WHERE namespace = :namespace"), {"namespace": namespace}
        )

    async def put_default(self, values: dict[str, Any], actor: str, now: datetime) -> None:
        await self.session.execute(_UPDATE_DEFAULT, {**_stored(values), "actor": actor, "now": now})

    async def namespaces_following_default(self) -> list[str]:
        result = await self.session.execute(
            sa.text(
                "SELECT s.namespace FROM namespace_status s WHERE NOT EXISTS "
                "(SELECT 1 FROM namespace_budgets b WHERE b.namespace = s.namespace) ORDER BY s.namespace"
            )
        )
        return list(result.scalars())

    async def figures(self, now: datetime, namespaces: list[str] | None = None) -> list[NamespaceFigures]:
        """Every known namespace's (or exactly the listed ones') budget and current-period totals."""
        result = await self.session.execute(*figures_query(now, namespaces))
        return [namespace_figures(row) for row in result]

    async def totals(self, namespace: str, kind: PeriodKind, start: datetime) -> tuple[Decimal, Decimal]:
        """(used, granted) of one namespace's period."""
        row = (
            await self.session.execute(_TOTALS, {"namespace": namespace, "kind": kind.value, "start": start})
        ).one_or_none()
        return (Decimal(0), Decimal(0)) if row is None else (row.used_gpu_minutes, row.granted_gpu_minutes)

    async def insert_grant(
        self,
        namespace: str,
        amount: Decimal,
        reason: str,
        actor: str,
        now: datetime,
        expires_at: datetime | None,
    ) -> Grant:
        result = await self.session.execute(
            sa.insert(Grant)
            .values(
                namespace=namespace,
                gpu_minutes=amount,
                reason=reason,
                granted_by=actor,
                granted_at=now,
                expires_at=expires_at,
            )
            .returning(Grant)
        )
        return result.scalar_one()

    async def grants(self, namespace: str, limit: int, before_id: int | None) -> Sequence[Grant]:
        """Newest first; page with before_id."""
        query = sa.select(Grant).where(Grant.namespace == namespace).order_by(Grant.id.desc()).limit(limit)
        if before_id is not None:
            query = query.where(Grant.id < before_id)
        return (await self.session.scalars(query)).all()

    async def grant_for_update(self, namespace: str, grant_id: int) -> Grant | None:
        """The namespace's grant, locked (a concurrent revoke waits, then finds it revoked)."""
        return (
            await self.session.scalars(
                sa.select(Grant).where(Grant.id == grant_id, Grant.namespace == namespace).with_for_update()
            )
        ).first()

    async def revoke_grant(self, grant_id: int, actor: str, now: datetime) -> Grant:
        """Revoked now; it stops counting now unless it already had (expired)."""
        result = await self.session.execute(
            sa.update(Grant)
            .where(Grant.id == grant_id)
            .values(revoked_at=now, revoked_by=actor, ended_at=sa.func.coalesce(Grant.ended_at, now))
            .returning(Grant)
            .execution_options(synchronize_session=False, populate_existing=True)
        )
        return result.scalar_one()

    async def end_expired_grants(self, now: datetime) -> list[str]:
        """Grants whose expiry has passed stop counting (ended at their expiry); answers the namespaces
        they belong to, whose granted totals need refreshing."""
        result = await self.session.execute(
            sa.update(Grant)
            .where(Grant.ended_at.is_(None), Grant.expires_at <= now)
            .values(ended_at=Grant.expires_at)
            .returning(Grant.namespace)
            .execution_options(synchronize_session=False)
        )
        return sorted(set(result.scalars()))

    async def refresh_granted(
        self, namespace: str, kind: PeriodKind, start: datetime, end: datetime | None
    ) -> None:
        """The period's granted total, recomputed from the grants that still count."""
        await self.session.execute(
            _REFRESH_GRANTED, {"namespace": namespace, "kind": kind.value, "start": start, "end": end}
        )

    async def add_granted(self, namespace: str, kind: PeriodKind, start: datetime, amount: Decimal) -> None:
        await self.session.execute(
            _ADD_GRANTED, {"namespace": namespace, "kind": kind.value, "start": start, "amount": amount}
        )

    async def rebuild_totals(
        self, namespaces: list[str], kind: PeriodKind, start: datetime, end: datetime | None
    ) -> None:
        if namespaces:
            parameters = {"namespaces": namespaces, "kind": kind.value, "start": start, "end": end}
            await self.session.execute(_REBUILD, parameters)
            await self.session.execute(_CLEAR_MODELS, parameters)
            await self.session.execute(_REBUILD_MODELS, parameters)
