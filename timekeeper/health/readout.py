"""The database's figures for the Prometheus scrape: every namespace's budget, the pools, idle pods and
pods of no known GPU model, read in one session."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from timekeeper.budgets.pools.service import PoolService
from timekeeper.budgets.service import BudgetService
from timekeeper.clock import Clock
from timekeeper.domain.clusters import namespace_key
from timekeeper.metrics import BudgetReadout, NamespaceRow
from timekeeper.settings import Settings
from timekeeper.usage.efficiency import EfficiencyService
from timekeeper.usage.repository import UsageRepository


async def read_budget_readout(session: AsyncSession, settings: Settings, clock: Clock) -> BudgetReadout:
    now = clock.now()
    statuses = await BudgetService(session, settings, clock).all()
    namespaces = [
        NamespaceRow(
            namespace=namespace_key(status.cluster, status.namespace),  # the answer names the two apart
            budget=None
            if status.budget_gpu_minutes is None
            else float(status.budget_gpu_minutes + status.granted_gpu_minutes),
            used=float(status.used_gpu_minutes),
            remaining=None if status.remaining_gpu_minutes is None else float(status.remaining_gpu_minutes),
            state=status.state,
            burn_rate=float(status.forecast.burn_rate_gpu_minutes_per_hour),
            exhaustion_seconds=None
            if status.forecast.exhausts_at is None
            else max(0.0, (status.forecast.exhausts_at - now).total_seconds()),
            models={
                model: (float(figures.remaining_gpu_minutes), figures.state)
                for model, figures in status.models.items()
            },
        )
        for status in statuses
    ]
    idle: dict[str, tuple[int, float]] = {}
    report = await EfficiencyService(session, settings, clock).idle(None)
    for pod in report.pods:
        key = namespace_key(pod.cluster, pod.namespace)  # the answer names the two apart
        count, shares = idle.get(key, (0, 0.0))
        idle[key] = (count + 1, shares + float(pod.gpu_share))
    pools = await PoolService(session, settings, clock).pools()
    return BudgetReadout(
        namespaces=namespaces,
        pools=[
            (
                pool.name,
                float(pool.budget_gpu_minutes + pool.granted_gpu_minutes),
                float(pool.used_gpu_minutes),
                pool.state,
            )
            for pool in pools
        ],
        idle=[(namespace, count, shares) for namespace, (count, shares) in sorted(idle.items())],
        unweighted_pods=await UsageRepository(session).running_pods_without_model(),
    )
