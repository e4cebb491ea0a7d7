"""Report ingest (the checks that need settings and the clock, then the batcher) and usage queries."""

from __future__ import annotations

import logging
from datetime import datetime
from decimal import Decimal

from sqlalchemy.ext.asyncio import AsyncSession

from timekeeper.budgets.periods import period_containing
from timekeeper.budgets.repository import BudgetRepository
from timekeeper.clock import Clock
from timekeeper.errors import TimekeeperError
from timekeeper.settings import Settings
from timekeeper.usage.batcher import IngestBatcher
from timekeeper.usage.repository import GroupBy, IngestOutcome, UsageRepository
from timekeeper.usage.schemas import ReportIn, UsageOut, UsageRow

log = logging.getLogger(__name__)


def check_report(settings: Settings, report: ReportIn, now: datetime) -> None:
    """The limits that depend on configuration; the report's own shape pydantic already checked."""
    if report.interval_end - report.interval_start > settings.max_report_interval:
        raise TimekeeperError(
            "interval is longer than the largest accepted "
            f"({settings.max_report_interval.total_seconds():g} s)",
            422,
        )
    if report.interval_start < now - settings.max_report_age:
        raise TimekeeperError(
            "interval_start is older than the oldest accepted "
            f"({settings.max_report_age.total_seconds():g} s ago); that time can no longer be charged",
            422,
        )
    if report.interval_end > now + settings.clock_skew:
        raise TimekeeperError(
            "interval_end is in the future "
            f"(beyond the {settings.clock_skew.total_seconds():g} s skew allowance)",
            422,
        )
    if report.gpu_share > Decimal(str(settings.max_gpu_share)):
        raise TimekeeperError(
            f"gpu_share above the largest believable share ({settings.max_gpu_share:g})", 422
        )


async def ingest_report(
    batcher: IngestBatcher, settings: Settings, clock: Clock, report: ReportIn
) -> IngestOutcome:
    """Check the report, then charge it with the reports arriving alongside it (group commit); answers
    after the commit."""
    check_report(settings, report, clock.now())
    outcome = await batcher.submit(report)
    if outcome.state_changed:
        log.info(
            "namespace_state_changed",
            extra={"namespace": report.namespace, "pod": report.pod, "state": outcome.state},
        )
    return outcome


class UsageService:
    def __init__(self, session: AsyncSession, settings: Settings, clock: Clock) -> None:
        self.session = session
        self.repository = UsageRepository(session)
        self.settings = settings
        self.clock = clock

    async def usage(
        self, namespace: str, since: datetime | None, until: datetime | None, group_by: GroupBy
    ) -> UsageOut:
        """Defaults: from the start of the namespace's current period until now."""
        now = self.clock.now()
        if since is None:
            config = await BudgetRepository(self.session).effective(namespace)
            since = period_containing(config.period, now).start
        until = until or now
        if until <= since:
            raise TimekeeperError("until must be after since", 422)
        rows = [
            UsageRow(key=key, gpu_minutes=minutes, reports=reports, mean_sm_util_pct=util)
            for key, minutes, reports, util in await self.repository.usage(namespace, since, until, group_by)
        ]
        return UsageOut(
            namespace=namespace,
            since=since,
            until=until,
            group_by=group_by,
            total_gpu_minutes=sum((row.gpu_minutes for row in rows), Decimal(0)),
            rows=rows,
        )
