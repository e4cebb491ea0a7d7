"""Namespace states and the admission snapshot the webhooks cache."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal

from sqlalchemy.ext.asyncio import AsyncSession

from gpuaccounting.admission_state import NamespaceAdmission
from gpuaccounting.wire import BudgetState, format_timestamp
from timekeeper.admission.repository import AdmissionRepository
from timekeeper.budgets.periods import budget_state
from timekeeper.budgets.repository import BudgetRepository, NamespaceFigures
from timekeeper.settings import Settings


def figures_state(figures: NamespaceFigures) -> BudgetState:
    config = figures.config
    return budget_state(
        config.budget_gpu_minutes,
        figures.granted_gpu_minutes,
        figures.used_gpu_minutes,
        config.warn_at_fraction,
    )


class AdmissionService:
    def __init__(self, session: AsyncSession, settings: Settings) -> None:
        self.repository = AdmissionRepository(session)
        self.budgets = BudgetRepository(session)
        self.settings = settings

    async def restate(self, now: datetime, namespaces: list[str] | None, *, config_changed: bool) -> None:
        """Recompute the namespaces' stored states (all known ones when None) from their figures now."""
        await self.record(await self.budgets.figures(now, namespaces), config_changed=config_changed)

    async def record(
        self, figures: Sequence[NamespaceFigures], *, config_changed: bool
    ) -> tuple[dict[str, BudgetState], set[str]]:
        """The one restate path (ingest, the scheduler's jobs, budget changes): store the state the
        figures put each namespace in, and bump the snapshot version when a state changed, or always when
        a budget's configuration did. Answers the states and the namespaces whose state changed."""
        states = {f.namespace: figures_state(f) for f in figures}
        changed = await self.repository.set_states(states)
        if changed or config_changed:
            await self.repository.bump_version()
        return states, changed

    async def version(self) -> int:
        """The snapshot's version. Reading writes nothing: the roll-over at midnight UTC (when every
        period begins) is the scheduler's `rollover` job's, which re-states every namespace."""
        return await self.repository.version()

    async def snapshot_json(self, now: datetime, version: int) -> str:
        """The gpuaccounting.admission_state.AdmissionState document under `version`, built by the
        database in one statement (cheap for 10,000 namespaces), each namespace with its resolved
        priority policy (its own, else the default's). Read after the version, so a change
        racing this read shows up under the next version rather than hiding under this one."""
        default = await self.budgets.default()
        return await self.repository.snapshot_json(
            version=version,
            generated_at=format_timestamp(now),
            priority_classes={
                "in_budget": self.settings.in_budget_priority_class,
                "over_budget": self.settings.over_budget_priority_class,
            },
            default=NamespaceAdmission(
                state=budget_state(
                    default.budget_gpu_minutes, Decimal(0), Decimal(0), default.warn_at_fraction
                ),
                max_gpu_share_per_pod=None
                if default.max_gpu_share_per_pod is None
                else float(default.max_gpu_share_per_pod),
                priority_policy=default.priority_policy,
            ),
        )
