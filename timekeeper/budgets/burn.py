"""The forecast's burn: GPU-minutes charged per namespace in 5-minute buckets (`usage_burn`), kept by
ingest with the ledger rows, so a budget read sums a window's few buckets instead of the ledger.
The rule (`attribute`): a report's charge goes to the buckets its charged time overlaps, in proportion,
rounded to the ledger's scale with the remainder in the last bucket, so the buckets sum to the ledger's
charge exactly; a read prorates the oldest bucket by its part inside the window. Only charges burn."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

BUCKET = timedelta(minutes=5)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NANO = Decimal("0.000000001")
# Kept past the forecast window before the roll-up job purges a bucket: replicas whose window settings
# differ for a while (a rolling update) and a window widened by up to this much still read a full window.
PURGE_MARGIN = timedelta(days=1)

BurnKey = tuple[str, datetime]  # (namespace, bucket start): one bucket, in the lock order
# ((namespace, GPU model), bucket start): one bucket of a model's raw burn (usage_model_burn).
ModelBurnKey = tuple[tuple[str, str], datetime]
Owner = TypeVar("Owner", str, tuple[str, str])  # whose bucket: a namespace, or a namespace's model


def bucket_of(moment: datetime) -> datetime:
    """The start of the bucket the moment falls in (buckets are counted from the Unix epoch, in UTC)."""
    return _EPOCH + (moment - _EPOCH) // BUCKET * BUCKET


def _microseconds(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def attribute(
    charges: Iterable[tuple[Owner, Decimal, Iterable[tuple[datetime, datetime]]]],
) -> dict[tuple[Owner, datetime], Decimal]:
    """What the buckets gain from charges of (namespace, GPU-minutes, the charged time's pieces): each
    charge split over the buckets its time overlaps in proportion to that time (exactly: the parts sum
    to the charge); in key order, the order every writer locks buckets in. The same rule, with
    (namespace, model) for the namespace, gives the per-model burn (raw GPU-minutes)."""
    added: dict[tuple[Owner, datetime], Decimal] = defaultdict(Decimal)
    for namespace, amount, pieces in charges:
        if not amount:
            continue
        spans: list[tuple[datetime, int]] = []
        for lower, upper in pieces:
            start = bucket_of(lower)
            while start < upper:
                end = start + BUCKET
                spans.append((start, _microseconds(min(upper, end) - max(lower, start))))
                start = end
        total = sum(microseconds for _, microseconds in spans)
        if not total:
            continue
        left = amount
        for start, microseconds in spans[:-1]:
            part = (amount * microseconds / total).quantize(_NANO, rounding=ROUND_HALF_UP)
            added[(namespace, start)] += part
            left -= part
        added[(namespace, spans[-1][0])] += left
    return dict(sorted(added.items()))


# The GPU-minutes each namespace burnt in the window [since, until), from its buckets: every bucket from
# the one holding `since` (counted for the part of it inside the window, `oldest_part`) up to the one
# holding `until`; charged time after `until` in that newest bucket (a report ending within the
# clock-skew allowance) counts too. Of the namespaces `{namespaces}` keeps (a condition and AND, or
# nothing: every one), one primary-key range each; no row for a namespace that burnt nothing.
BURNED_SQL = (
    "SELECT namespace, round(sum(CASE WHEN bucket_start = :oldest THEN gpu_minutes * :oldest_part "
    "ELSE gpu_minutes END), 9) AS burned FROM usage_burn "
    "WHERE {namespaces} bucket_start >= :oldest AND bucket_start < :until GROUP BY namespace"
)


# The same per GPU model, of one namespace (`e.namespace`), as one JSON object {model: burned} (text
# amounts, exact); NULL when no model burnt.
MODEL_BURNED_SQL = (
    "SELECT jsonb_object_agg(b.model, CAST(b.burned AS text)) AS model_burned FROM ("
    "SELECT model, round(sum(CASE WHEN bucket_start = :oldest THEN gpu_minutes * :oldest_part "
    "ELSE gpu_minutes END), 9) AS burned FROM usage_model_burn "
    "WHERE namespace = e.namespace AND bucket_start >= :oldest AND bucket_start < :until GROUP BY model) b"
)


def window_parameters(since: datetime, until: datetime) -> dict[str, object]:
    """BURNED_SQL's parameters: the window's oldest bucket, the part of that bucket inside it, its end."""
    oldest = bucket_of(since)
    inside = _microseconds(oldest + BUCKET - since)
    return {"oldest": oldest, "oldest_part": Decimal(inside) / _microseconds(BUCKET), "until": until}


class BurnRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def purge(self, before: datetime) -> int:
        """Drops the buckets that end by `before` (older than any window read); answers how many."""
        result = await self.session.execute(
            sa.text("DELETE FROM usage_burn WHERE bucket_start < :before"),
            {"before": bucket_of(before)},
        )
        await self.session.execute(
            sa.text("DELETE FROM usage_model_burn WHERE bucket_start < :before"),
            {"before": bucket_of(before)},
        )
        return int(result.rowcount)  # type: ignore[attr-defined]


def burn_rows(added: Mapping[BurnKey, Decimal]) -> list[dict[str, str]]:
    """The buckets' gains as the ingest's upsert reads them (batch_json rows): amounts as exact text."""
    return [
        {"namespace": namespace, "bucket_start": start.isoformat(), "gpu_minutes": str(amount)}
        for (namespace, start), amount in added.items()
    ]


def model_burn_rows(added: Mapping[ModelBurnKey, Decimal]) -> list[dict[str, str]]:
    """The per-model buckets' gains, as burn_rows."""
    return [
        {
            "namespace": namespace,
            "model": model,
            "bucket_start": start.isoformat(),
            "gpu_minutes": str(amount),
        }
        for ((namespace, model), start), amount in added.items()
    ]
