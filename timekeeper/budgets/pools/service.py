"""Pools: admins create, replace and delete them (audited); members' readers read them. A change moves
namespaces in or out of a pool, so it rebuilds the current totals of every namespace whose period kind it
changes (a member counts in its pool's period) and refreshes all their states in the request's transaction."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from timekeeper.audit.repository import AuditRepository
from timekeeper.auth.base import Principal
from timekeeper.budgets.model_figures import forecast_window, models_out
from timekeeper.budgets.pools.models import BudgetPool
from timekeeper.budgets.pools.repository import PoolRepository
from timekeeper.budgets.pools.schemas import NamespaceSelectorBody, PoolIn, PoolMemberOut, PoolOut
from timekeeper.budgets.repository import BudgetRepository, statuses, stored_models
from timekeeper.budgets.schemas import model_amounts
from timekeeper.budgets.states.budget_states import BudgetStates
from timekeeper.clock import Clock
from timekeeper.domain.clusters import cluster_of, namespace_key, split_key
from timekeeper.domain.figures import MemberFigures, used_on
from timekeeper.domain.periods import PeriodKind, period_containing
from timekeeper.domain.states import budget_state, member_state, pool_state
from timekeeper.errors import TimekeeperError
from timekeeper.schemas import period_out
from timekeeper.settings import Settings


def _number(value: Decimal | None) -> str | None:
    return None if value is None else format(value.normalize(), "f")


def audited(pool: BudgetPool, listed: dict[str, Decimal | None]) -> dict[str, Any]:
    """The audit log's view of a pool."""
    return {
        "budget_gpu_minutes": _number(pool.budget_gpu_minutes),
        "period": pool.period,
        "warn_at_fraction": _number(pool.warn_at_fraction),
        "namespace_selector": pool.namespace_selector,
        "models": pool.models,
        "model_policy": pool.model_policy,
        "members": [{"namespace": ns, "cap_gpu_minutes": _number(cap)} for ns, cap in listed.items()],
    }


def pool_out(
    pool: BudgetPool,
    members: Sequence[MemberFigures],
    now: datetime,
    model_used: Mapping[str, Decimal],
    model_burned: Mapping[str, Decimal],
    settings: Settings,
) -> PoolOut:
    """`model_used`, `model_burned`: the members' raw GPU-minutes per model together, in the period and
    over the forecast window."""
    state = pool_state(pool.budget_gpu_minutes, pool.warn_at_fraction, members)
    budgets = stored_models(pool.models)
    period = period_out(PeriodKind(pool.period), now)
    model_states = {
        model: budget_state(budget, Decimal(0), used_on(model_used, model), pool.warn_at_fraction)
        for model, budget in budgets.items()
    }
    used = sum((member.used_gpu_minutes for member in members), Decimal(0))
    granted = sum((member.granted_gpu_minutes for member in members), Decimal(0))
    selector = pool.namespace_selector
    return PoolOut(
        name=pool.name,
        period=period,
        budget_gpu_minutes=pool.budget_gpu_minutes,
        granted_gpu_minutes=granted,
        used_gpu_minutes=used,
        remaining_gpu_minutes=pool.budget_gpu_minutes + granted - used,
        state=state,
        warn_at_fraction=pool.warn_at_fraction,
        namespace_selector=None if selector is None else NamespaceSelectorBody(matchLabels=selector),
        members=[
            PoolMemberOut(
                namespace=member.namespace,
                listed=member.listed,
                cap_gpu_minutes=member.cap_gpu_minutes,
                used_gpu_minutes=member.used_gpu_minutes,
                granted_gpu_minutes=member.granted_gpu_minutes,
                state=member_state(state, member, pool.warn_at_fraction),
            )
            for member in members
        ],
        models=models_out(budgets, model_used, now, model_states, model_burned, settings, period.end),
        model_policy="steer" if pool.model_policy == "steer" else "reduce",
        updated_at=pool.updated_at,
        updated_by=pool.updated_by,
        updated_by_cluster=pool.updated_by_cluster,
    )


def seen_from(pool: PoolOut, cluster: str | None, scope: frozenset[str] | None) -> PoolOut:
    """The pool as a reader of `cluster` sees it: its totals, which decide the class of the reader's own
    namespaces, and the figures of the members of that cluster only (docs/fleet.md#pools-across-clusters).
    The hub's readers of every namespace (`scope` None: the fleet's view) see every member's."""
    if scope is None:
        return pool
    own = [member for member in pool.members if cluster_of(member.namespace) == cluster]
    return pool.model_copy(update={"members": own})


class PoolService:
    def __init__(self, session: AsyncSession, settings: Settings, clock: Clock) -> None:
        self.session = session
        self.repository = PoolRepository(session)
        self.budgets = BudgetRepository(session)
        self.audit = AuditRepository(session)
        self.states = BudgetStates(session)
        self.settings = settings
        self.clock = clock

    async def pools(self, names: Sequence[str] | None = None) -> list[PoolOut]:
        now = self.clock.now()
        pools = await self.repository.pools(names)
        members = await self.repository.members([pool.name for pool in pools], now)
        answers = []
        for pool in pools:
            used, burned = await self._model_figures(pool, members[pool.name])
            answers.append(pool_out(pool, members[pool.name], now, used, burned, self.settings))
        return answers

    async def _model_figures(
        self, pool: BudgetPool, members: Sequence[MemberFigures]
    ) -> tuple[dict[str, Decimal], dict[str, Decimal]]:
        """The members' raw GPU-minutes per model together, and their per-model burn over the forecast
        window together; read only for a pool with per-model budgets."""
        used: dict[str, Decimal] = defaultdict(Decimal)
        burned: dict[str, Decimal] = defaultdict(Decimal)
        if pool.models and members:
            now = self.clock.now()
            names = [member.namespace for member in members]
            found, _, model_burned = await statuses(
                self.session, now, now - forecast_window(self.settings), names
            )
            for figures in found:
                for model, amount in figures.model_used.items():
                    used[model] += amount
                for model, amount in model_burned.get(figures.namespace, {}).items():
                    burned[model] += amount
        return used, burned

    async def pool(self, name: str) -> PoolOut:
        found = await self.pools([name])
        if not found:
            raise TimekeeperError(f"no pool {name}", 404)
        return found[0]

    async def visible(self, scope: frozenset[str] | None) -> list[PoolOut]:
        """Every pool for a cluster-wide reader; for a scoped one, the pools one of its namespaces is in."""
        pools = await self.pools()
        if scope is None:
            return pools
        return [pool for pool in pools if any(member.namespace in scope for member in pool.members)]

    async def of_namespace(self, namespace: str) -> PoolOut:
        pool = (await self.budgets.effective(namespace)).pool
        if pool is None:
            raise TimekeeperError(f"namespace {namespace} is in no pool", 404)
        return await self.pool(pool)

    def _listed_keys(self, body: PoolIn) -> dict[str, Decimal | None]:
        """The listed members by namespace key (docs/fleet.md): a bare name is the hub's own cluster's, a
        key `<cluster>/<namespace>` a member cluster's, of a cluster this timekeeper serves."""
        listed: dict[str, Decimal | None] = {}
        for member in body.members:
            cluster, namespace = split_key(member.namespace)
            if cluster is not None and cluster not in self.settings.members:
                raise TimekeeperError(f"{member.namespace}: {cluster} is not a member cluster", 422)
            key = namespace_key(cluster, namespace)
            if key in listed:
                raise TimekeeperError(f"{key} is listed twice", 422)
            listed[key] = member.cap_gpu_minutes
        return listed

    async def put(self, name: str, body: PoolIn, principal: Principal) -> PoolOut:
        now = self.clock.now()
        listed = self._listed_keys(body)
        elsewhere = await self.repository.listed_elsewhere(name, sorted(listed))
        if elsewhere:
            raise TimekeeperError(
                "already listed in another pool: "
                + ", ".join(f"{ns} (pool {pool})" for ns, pool in sorted(elsewhere.items())),
                409,
            )
        previous = await self.repository.pool_for_update(name)
        old = None if previous is None else audited(previous, await self.repository.listed(name))
        before = await self._periods(name, sorted(listed), now)
        values = body.model_dump(include={"budget_gpu_minutes", "period", "warn_at_fraction", "model_policy"})
        amounts = model_amounts(body.models)
        values["models"] = {model: format(amount, "f") for model, amount in amounts.items()} or None
        values["namespace_selector"] = (
            None if body.namespace_selector is None else body.namespace_selector.matchLabels
        )
        await self.repository.put(name, values, listed, principal, now)
        [pool] = await self.repository.pools([name])
        await self.audit.record(now, principal, "pool.put", None, old, audited(pool, listed) | {"name": name})
        await self._refresh_after_change(before, now)
        return await self.pool(name)

    async def delete(self, name: str, principal: Principal) -> None:
        now = self.clock.now()
        pool = await self.repository.pool_for_update(name)
        if pool is None:
            raise TimekeeperError(f"no pool {name}", 404)
        old = audited(pool, await self.repository.listed(name)) | {"name": name}
        before = await self._periods(name, [], now)
        await self.repository.delete(name)
        await self.audit.record(now, principal, "pool.delete", None, old, None)
        await self._refresh_after_change(before, now)

    async def sync_labels(self, listed: dict[str, dict[str, str]], cluster: str | None = None) -> list[str]:
        """Store the labels of `cluster`'s namespaces (None: the local cluster's) as the reconciler listed
        them there, under their namespace keys (another cluster's are not touched); the namespaces whose
        pool that changed have their totals and states refreshed as a pool change does, with their old and
        new pools' members. Answers the namespaces (keys) that moved."""
        now = self.clock.now()
        labels = {namespace_key(cluster, namespace): value for namespace, value in listed.items()}
        known = {
            key: value
            for key, value in (await self.repository.labels()).items()
            if cluster_of(key) == cluster
        }
        changed = sorted(ns for ns in known.keys() | labels.keys() if known.get(ns) != labels.get(ns))
        if not changed:
            return []
        before = {f.namespace: f.config for f in await self.budgets.figures(now, changed)}
        await self.repository.put_labels(labels, now, sorted(known.keys() - labels.keys()))
        after = {f.namespace: f.config for f in await self.budgets.figures(now, changed)}
        moved = [ns for ns in changed if before[ns].pool != after[ns].pool]
        if moved:
            pools = sorted({c.pool for ns in moved for c in (before[ns], after[ns]) if c.pool is not None})
            others = {
                m.namespace for listed in (await self.repository.members(pools, now)).values() for m in listed
            }
            periods = {ns: before[ns].period for ns in moved}
            periods |= {
                f.namespace: f.config.period
                for f in await self.budgets.figures(now, sorted(others - set(moved)))
            }
            await self._refresh_after_change(periods, now)
        return moved

    async def _periods(self, name: str, also: Sequence[str], now: datetime) -> dict[str, PeriodKind]:
        """The period kind each namespace a change of the pool may affect counts in now: its members
        (listed or selected) and the namespaces about to be listed."""
        members = (await self.repository.members([name], now))[name]
        namespaces = sorted({member.namespace for member in members} | set(also))
        figures = await self.budgets.figures(now, namespaces) if namespaces else []
        return {f.namespace: f.config.period for f in figures}

    async def _refresh_after_change(self, before: dict[str, PeriodKind], now: datetime) -> None:
        """Rebuild the current totals of the namespaces whose period kind the change moved (each now counts
        in another kind, whose running total missed what it charged under the old one), then refresh
        their states (their pool's other members with them) and bump the snapshot version."""
        namespaces = sorted(before)
        if not namespaces:
            return
        moved: dict[PeriodKind, list[str]] = defaultdict(list)
        for figures in await self.budgets.figures(now, namespaces):
            if figures.config.period != before[figures.namespace]:
                moved[figures.config.period].append(figures.namespace)
        for kind, targets in moved.items():
            period = period_containing(kind, now)
            await self.budgets.rebuild_totals(targets, kind, period.start, period.end)
        await self.states.refresh(now, namespaces, config_changed=True)
