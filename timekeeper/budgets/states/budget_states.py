"""The namespaces' budget states as stored: decided from the figures by the one rule
(domain/states.py) and written, with the snapshot version bumped when one changes."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from gpuaccounting.wire import BudgetState
from timekeeper.budgets.pools.repository import PoolRepository
from timekeeper.budgets.repository import BudgetRepository
from timekeeper.budgets.states.repository import StateRepository
from timekeeper.db.locks import in_lock_order
from timekeeper.domain.figures import NamespaceFigures
from timekeeper.domain.states import figures_state, member_state, pool_state


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

    async def store(
        self, figures: Sequence[NamespaceFigures], *, config_changed: bool, now: datetime
    ) -> tuple[dict[str, BudgetState], set[str]]:
        """Store the states the figures decide (`decide`) and bump the snapshot version when one changed, or
        always when a configuration did. Answers the states and the namespaces whose state changed."""
        states = await self.decide(figures, now, lock=True)
        changed = await self.repository.set_states(states)
        if changed or config_changed:
            await self.repository.bump_version()
        return states, changed
