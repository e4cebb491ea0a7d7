"""The namespaces' budget states as stored: decided from the figures by the one rule
(domain/states.py) and written, with the snapshot version bumped when one changes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal

from sqlalchemy.ext.asyncio import AsyncSession

from gpuaccounting.wire import BudgetState
from timekeeper.budgets.pools.repository import PoolRepository
from timekeeper.budgets.repository import BudgetRepository
from timekeeper.budgets.states.repository import StateRepository
from timekeeper.db.locks import in_lock_order
from timekeeper.domain.figures import NamespaceFigures, used_on
from timekeeper.domain.states import budget_state, figures_state, member_state, model_states, pool_state

# Each namespace's budgeted GPU models' states ({namespace: {model: state}}).
ModelStates = dict[str, dict[str, BudgetState]]


def unpooled_states(figures: Sequence[NamespaceFigures]) -> dict[str, BudgetState] | None:
    """`BudgetStates.decide` when no namespace of `figures` is in a pool: each budget's own rule,
    which reads nothing (None: some are, and their pools' figures are to be read)."""
    if any(f.config.pool is not None for f in figures):
        return None
    return {f.namespace: figures_state(f) for f in figures}


class BudgetStates:
    def __init__(self, session: AsyncSession) -> None:
        self.repository = StateRepository(session)
        self.budgets = BudgetRepository(session)
        self.pools = PoolRepository(session)

    async def refresh(self, now: datetime, namespaces: list[str] | None, *, config_changed: bool) -> None:
        """Recompute the namespaces' stored states (all known ones when None) from their figures now."""
        await self.store(await self.budgets.figures(now, namespaces), config_changed=config_changed, now=now)

    async def decide(
        self, figures: Sequence[NamespaceFigures], now: datetime, *, lock: bool = False
    ) -> dict[str, BudgetState]:
        """The state the figures put each namespace in, and every member of their pools (a charge to one
        moves them all). With `lock`, every state to be written is locked first (in name order), so of two
        members charging at once the second sees the first's charge."""
        unpooled = unpooled_states(figures)
        if unpooled is not None:
            return unpooled
        states = {f.namespace: figures_state(f) for f in figures if f.config.pool is None}
        pools = sorted({f.config.pool for f in figures if f.config.pool is not None})
        members = await self.pools.members(pools, now)
        if lock:
            pooled = {member.namespace for listed in members.values() for member in listed}
            await self.repository.lock_states(in_lock_order(pooled | {f.namespace for f in figures}))
            members = await self.pools.members(pools, now)
        configs = {pool.name: pool for pool in await self.pools.pools(pools)}
        for name, listed in members.items():
            pool = configs[name]
            state = pool_state(pool.budget_gpu_minutes, pool.warn_at_fraction, listed)
            states |= {
                member.namespace: member_state(state, member, pool.warn_at_fraction) for member in listed
            }
        return states

    async def decide_models(self, figures: Sequence[NamespaceFigures], now: datetime) -> ModelStates:
        """Each budgeted model's state, for the same namespaces as `decide` (after it, whose locks hold): a
        namespace's own from its figures; a pool member's, the pool's models map against every member's
        use of each model together (one state for all its members)."""
        return (await self.model_figures(figures, now))[0]

    async def model_figures(
        self, figures: Sequence[NamespaceFigures], now: datetime
    ) -> tuple[ModelStates, dict[str, dict[str, Decimal]]]:
        """`decide_models`, and the per-model use each state was decided from: a namespace's own, or a
        pool member's pool's (its members' together)."""
        states: ModelStates = {f.namespace: model_states(f) for f in figures if f.config.pool is None}
        governing = {f.namespace: dict(f.model_used) for f in figures if f.config.pool is None}
        pools = sorted({f.config.pool for f in figures if f.config.pool is not None})
        if not pools:
            return states, governing
        members = await self.pools.members(pools, now)
        names = sorted({member.namespace for listed in members.values() for member in listed})
        found = {f.namespace: f for f in await self.budgets.figures(now, names)}
        configs = {pool.name: pool for pool in await self.pools.pools(pools)}
        for name, listed in members.items():
            used: dict[str, Decimal] = defaultdict(Decimal)
            budgets = {}
            for member in listed:
                member_figures = found[member.namespace]
                budgets = dict(member_figures.config.models)  # the pool's, resolved for each member
                for model, amount in member_figures.model_used.items():
                    used[model] += amount
            pooled = {
                model: budget_state(budget, Decimal(0), used_on(used, model), configs[name].warn_at_fraction)
                for model, budget in sorted(budgets.items())
            }
            states |= {member.namespace: dict(pooled) for member in listed}
            governing |= {member.namespace: dict(used) for member in listed}
        return states, governing

    async def store(
        self, figures: Sequence[NamespaceFigures], *, config_changed: bool, now: datetime
    ) -> tuple[dict[str, BudgetState], set[str]]:
        """Store the states the figures decide (`decide`, `decide_models`) and bump the snapshot version
        when one changed, or always when a configuration did. Answers the states and the namespaces whose
        state (the total's or a model's) changed."""
        states = await self.decide(figures, now, lock=True)
        models = await self.decide_models(figures, now)
        changed = await self.repository.set_states(states, models)
        if changed or config_changed:
            await self.repository.bump_version()
        return states, changed
