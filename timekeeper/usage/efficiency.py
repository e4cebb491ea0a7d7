"""Efficiency: per namespace and pod, the GPU-minutes allocated beside the GPU-minutes utilised (allocation
x mean SM utilisation, over the time that had measurements), and the idle report (pods holding GPUs for a
while and using almost none of them). Exact: every figure is a decimal the database rounded once."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal

from sqlalchemy.ext.asyncio import AsyncSession

from timekeeper.budgets.repository import BudgetRepository
from timekeeper.clock import Clock
from timekeeper.domain.clusters import split_key
from timekeeper.domain.periods import period_containing
from timekeeper.errors import TimekeeperError
from timekeeper.settings import Settings
from timekeeper.usage.repository import PodEfficiency, UsageRepository
from timekeeper.usage.schemas import EfficiencyOut, IdlePodOut, IdleReportOut, PodEfficiencyOut

_RATIO = Decimal("1e-9")


def ratio(utilised: Decimal, measured: Decimal) -> Decimal | None:
    """Utilised over measured GPU-minutes, to nine places; None where no time had measurements."""
    return None if measured == 0 else (utilised / measured).quantize(_RATIO, ROUND_HALF_EVEN)


def pod_out(row: PodEfficiency) -> PodEfficiencyOut:
    return PodEfficiencyOut(
        pod=row.pod,
        allocated_gpu_minutes=row.allocated_gpu_minutes,
        measured_gpu_minutes=row.measured_gpu_minutes,
        utilised_gpu_minutes=row.utilised_gpu_minutes,
        efficiency=ratio(row.utilised_gpu_minutes, row.measured_gpu_minutes),
    )


class EfficiencyService:
    def __init__(self, session: AsyncSession, settings: Settings, clock: Clock) -> None:
        self.usage = UsageRepository(session)
        self.budgets = BudgetRepository(session)
        self.settings = settings
        self.clock = clock

    async def efficiency(
        self, namespace: str, since: datetime | None, until: datetime | None
    ) -> EfficiencyOut:
        """Defaults as the usage answer's: from the start of the namespace's current period until now. The
        namespace's figures are the sums of its pods' (each rounded once), so they add up exactly."""
        now = self.clock.now()
        if since is None:
            since = period_containing((await self.budgets.effective(namespace)).period, now).start
        until = until or now
        if until <= since:
            raise TimekeeperError("until must be after since", 422)
        pods = await self.usage.efficiency(namespace, since, until)
        measured = sum((pod.measured_gpu_minutes for pod in pods), Decimal(0))
        utilised = sum((pod.utilised_gpu_minutes for pod in pods), Decimal(0))
        cluster, bare = split_key(namespace)
        return EfficiencyOut(
            namespace=bare,
            cluster=cluster,
            since=since,
            until=until,
            allocated_gpu_minutes=sum((pod.allocated_gpu_minutes for pod in pods), Decimal(0)),
            measured_gpu_minutes=measured,
            utilised_gpu_minutes=utilised,
            efficiency=ratio(utilised, measured),
            pods=[pod_out(pod) for pod in pods],
        )

    async def idle(self, namespaces: Sequence[str] | None) -> IdleReportOut:
        """Running pods (of the namespaces, or all) that have held their GPUs for at least idle_after
        and whose mean SM utilisation over the last idle_after is below idle_below_sm_util_pct."""
        now = self.clock.now()
        held_for = self.settings.idle_after
        below = Decimal(str(self.settings.idle_below_sm_util_pct))
        held = await self.usage.held_pods(namespaces, now - held_for, now)
        return IdleReportOut(
            generated_at=now,
            held_for_seconds=held_for.total_seconds(),
            below_sm_util_pct=below,
            pods=[
                IdlePodOut(
                    namespace=split_key(pod.namespace)[1],
                    cluster=split_key(pod.namespace)[0],
                    pod=pod.pod,
                    pod_uid=split_key(pod.pod_uid)[1],
                    gpu_share=pod.gpu_share,
                    held_since=pod.held_from,
                    window_gpu_minutes=pod.allocated_gpu_minutes,
                    mean_sm_util_pct=pod.mean_sm_util_pct.quantize(Decimal("0.001"), ROUND_HALF_EVEN),
                )
                for pod in held
                if pod.mean_sm_util_pct < below
            ],
        )
