"""SQL for the forecast: GPU-minutes charged inside a recent window, per namespace, from the ledger. Kept
apart from the budget figures' statement so each stays simple; the list endpoint asks for every namespace
in one statement."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from timekeeper.db.driver import driver_rows

# A ledger row wholly inside the window counts its charge as it stands; a row crossing an edge counts its
# charged time clipped to the window, at its charge rate and GPU weight (as the budget counted it). Hourly
# aggregates (rows folded by the roll-up job) can only hold time from before `folded_before` (now -
# rollup_retention), so they are read only when the window reaches back that far: a one-time filter, no
# scan otherwise.
_CLIPPED_MINUTES = (
    "{t}.charge_share * (SELECT coalesce(sum(gpu_weighted_seconds({t}.gpu_model, r)), 0) "
    "FROM unnest({t}.charged * tstzmultirange(tstzrange(:since, :until))) AS r) / 60"
)
_BURNED = sa.text(
    f"""
    SELECT namespace, round(sum(minutes), 9) AS burned FROM (
        SELECT l.namespace,
            CASE WHEN l.interval_start >= :since AND l.interval_end <= :until THEN l.gpu_minutes
                 ELSE {_CLIPPED_MINUTES.format(t="l")} END AS minutes
        FROM usage_ledger l
        WHERE (CAST(:namespaces AS text[]) IS NULL OR l.namespace = ANY(CAST(:namespaces AS text[])))
          AND l.interval_end > :since AND l.interval_start < :until
        UNION ALL
        SELECT h.namespace, {_CLIPPED_MINUTES.format(t="h")}
        FROM usage_hourly h
        WHERE CAST(:since AS timestamptz) < CAST(:folded_before AS timestamptz)
          AND (CAST(:namespaces AS text[]) IS NULL OR h.namespace = ANY(CAST(:namespaces AS text[])))
          AND h.hour_start > CAST(:since AS timestamptz) - interval '1 hour' AND h.hour_start < :until
    ) charged
    GROUP BY namespace
    """
)


class BurnRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def burned(
        self, since: datetime, until: datetime, folded_before: datetime, namespaces: list[str] | None = None
    ) -> dict[str, Decimal]:
        """GPU-minutes charged in [since, until) per namespace (every namespace, or exactly the listed
        ones); a namespace that charged nothing there is absent."""
        rows = await driver_rows(
            self.session,
            _BURNED,
            {"since": since, "until": until, "folded_before": folded_before, "namespaces": namespaces},
        )
        return {row.namespace: row.burned for row in rows}
