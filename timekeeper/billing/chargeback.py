"""The chargeback export: per period, namespace and GPU model, raw and charged GPU-minutes, utilisation and
cost at the admin-set price per GPU-hour. Each row is the usage API's answer by model for that namespace and
period (the same exact sums, one statement for them all), streamed as JSON or CSV one row at a time. A row
names its cluster and the bare namespace (timekeeper/domain/clusters.py); the JSON answer ends with the
totals of each cluster and of all, the exact sums of its rows, so they agree with any sum of the rows."""

from __future__ import annotations

import asyncio
import csv
import io
import math
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Literal, TypeVar, cast

import orjson
import psycopg
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from timekeeper.billing.repository import BillingRepository
from timekeeper.domain.clusters import cluster_label, split_key
from timekeeper.domain.periods import Period, PeriodKind, count_periods, periods_overlapping
from timekeeper.errors import TimekeeperError
from timekeeper.usage.repository import UNKNOWN_MODEL, UsageRepository

ExportFormat = Literal["json", "csv"]
BucketKind = Literal["daily", "weekly", "monthly"]
MAX_PERIODS = 400  # a year of days; a longer range asks for weeks or months
COLUMNS = (
    "period_start",
    "period_end",
    "namespace",
    "gpu_model",
    "raw_gpu_minutes",
    "gpu_minutes",
    "mean_sm_util_pct",
    "price_per_gpu_hour",
    "cost",
    "currency",
    "cluster",  # last: a single cluster's CSV keeps its columns where they were
)
_MINUTES_PER_HOUR = Decimal(60)
_CENT_FRACTION = Decimal("0.000001")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ChargebackRange:
    since: datetime
    until: datetime
    periods: tuple[Period, ...]


def chargeback_range(kind: BucketKind, since: datetime, until: datetime) -> ChargebackRange:
    """The periods of `kind` that [since, until) touches, each clipped to it; counted before any is built."""
    if until <= since:
        raise TimekeeperError("until must be after since", 422)
    count = count_periods(PeriodKind(kind), since, until)
    if count > MAX_PERIODS:
        raise TimekeeperError(
            f"the range holds {count} {kind} periods; at most {MAX_PERIODS} (ask for longer periods)", 422
        )
    periods = periods_overlapping(PeriodKind(kind), since, until)
    clipped = tuple(
        Period(period.kind, max(period.start, since), min(period.end or until, until)) for period in periods
    )
    return ChargebackRange(since, until, clipped)


def cost(raw_gpu_minutes: Decimal, price_per_gpu_hour: Decimal | None) -> Decimal | None:
    """GPU-hours actually held (raw: weights say what a minute counts against a budget, prices what an
    hour of that GPU costs) x the model's price; None where the model has no price."""
    if price_per_gpu_hour is None:
        return None
    return (raw_gpu_minutes / _MINUTES_PER_HOUR * price_per_gpu_hour).quantize(_CENT_FRACTION)


class ChargebackExports:
    """This process's chargeback exports: `size` at once, on `sessions` (a pool of their own, never the
    requests'); one more waits `wait_seconds` for its turn, then is refused 429 with Retry-After. Each
    export reads every ledger row of its range: more at once would take the database's cores from ingest."""

    def __init__(
        self, sessions: Callable[[], async_sessionmaker[AsyncSession]], size: int, wait_seconds: float
    ) -> None:
        self._sessions = sessions
        self._turns = asyncio.Semaphore(size)
        self.wait_seconds = wait_seconds

    async def rows(
        self,
        span: ChargebackRange,
        namespaces: Sequence[str] | None,
        currency: str,
        cluster: str | None = None,
    ) -> AsyncIterator[dict[str, object]]:
        """chargeback_rows in its turn, its first row read already: the statement's work is done before
        an answer starts, so a refusal or a statement cut off at its timeout answers its own status."""
        return await started(self._in_turn(span, namespaces, currency, cluster))

    async def _in_turn(
        self, span: ChargebackRange, namespaces: Sequence[str] | None, currency: str, cluster: str | None
    ) -> AsyncGenerator[dict[str, object], None]:
        try:
            async with asyncio.timeout(self.wait_seconds):
                await self._turns.acquire()
        except TimeoutError:
            retry = str(max(1, math.ceil(self.wait_seconds)))
            raise TimekeeperError(
                "every chargeback export's turn is taken; retry later", 429, {"Retry-After": retry}
            ) from None
        try:
            # Closed before the turn is given back: its session's connection returns to the pool first.
            found = chargeback_rows(self._sessions(), span, namespaces, currency, cluster)
            async with aclosing(found) as rows:
                async for row in rows:
                    yield row
        except sa.exc.OperationalError as error:
            if not isinstance(error.orig, psycopg.errors.QueryCanceled):
                raise
            raise TimekeeperError(
                "the export ran past its time limit (TIMEKEEPER_CHARGEBACK_EXPORT_TIMEOUT_SECONDS); "
                "ask for a shorter range",
                503,
            ) from None
        finally:
            self._turns.release()


async def started(rows: AsyncGenerator[T, None]) -> AsyncIterator[T]:
    """`rows` with its first item read now; the rest as they are asked for (and `rows` closed after)."""
    try:
        first = await anext(rows)
    except StopAsyncIteration:
        return _empty()
    return _after(first, rows)


async def _empty() -> AsyncIterator[T]:
    nothing: tuple[T, ...] = ()
    for item in nothing:
        yield item


async def _after(first: T, rest: AsyncGenerator[T, None]) -> AsyncIterator[T]:
    try:
        yield first
        async for item in rest:
            yield item
    finally:
        await rest.aclose()


async def chargeback_rows(
    sessions: async_sessionmaker[AsyncSession],
    span: ChargebackRange,
    namespaces: Sequence[str] | None,
    currency: str,
    cluster: str | None = None,
) -> AsyncGenerator[dict[str, object], None]:
    """One row per period, namespace key (of `namespaces`; None: all) of `cluster` (None: every cluster;
    LOCAL_CLUSTER_LABEL: the local one) and GPU model with use, in the order of period, cluster, namespace
    and model: one statement for them all, read from a server-side cursor a batch at a time."""
    by_start = {period.start: period for period in span.periods}
    async with sessions() as session:
        prices = {
            price.model: price.price_per_gpu_hour for price in await BillingRepository(session).prices()
        }
        found = UsageRepository(session).usage_by_period(
            namespaces, [(period.start, period.end or span.until) for period in span.periods], cluster
        )
        async for period_start, key, row in found:
            period = by_start[period_start]
            price = None if row.key == UNKNOWN_MODEL else prices.get(row.key)
            yield {
                "period_start": period.start,
                "period_end": period.end,
                "namespace": split_key(key)[1],
                "gpu_model": row.key,
                "raw_gpu_minutes": row.raw_gpu_minutes,
                "gpu_minutes": row.gpu_minutes,
                "mean_sm_util_pct": row.figures.answer()["mean_sm_util_pct"],
                "price_per_gpu_hour": price,
                "cost": cost(row.raw_gpu_minutes, price),
                "currency": currency,
                "cluster": cluster_label(key),
            }


# A cell a spreadsheet would read as a formula starts with one of these (OWASP, "CSV Injection").
FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, Decimal):
        return format(value.normalize(), "f")
    return escape_formula(str(value))


def escape_formula(text: str) -> str:
    """`text` with a leading quote when a spreadsheet would run it as a formula (a GPU's name is the
    tenant's input); our own numbers are never escaped."""
    return "'" + text if text.startswith(FORMULA_PREFIXES) else text


async def as_csv(rows: AsyncIterator[dict[str, object]]) -> AsyncIterator[bytes]:
    """RFC 4180 CSV with a header; exact decimals as plain text, formula-like text escaped."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(COLUMNS)
    yield buffer.getvalue().encode()
    async for row in rows:
        buffer.seek(0)
        buffer.truncate()
        writer.writerow([_text(row[column]) for column in COLUMNS])
        yield buffer.getvalue().encode()


def _json_default(value: object) -> object:
    if isinstance(value, Decimal):
        return float(value)
    raise TypeError(type(value).__name__)


@dataclass(slots=True)
class Totals:
    """The exact sums of some rows' minutes and costs (each row's cost already rounded): a cluster's total
    is the sum of its rows, and all clusters' the sum of theirs, with no rounding of its own."""

    raw_gpu_minutes: Decimal = Decimal(0)
    gpu_minutes: Decimal = Decimal(0)
    cost: Decimal | None = None  # None while no row has a price

    def add(self, row: dict[str, object]) -> None:
        self.raw_gpu_minutes += cast(Decimal, row["raw_gpu_minutes"])
        self.gpu_minutes += cast(Decimal, row["gpu_minutes"])
        priced = cast(Decimal | None, row["cost"])
        if priced is not None:
            self.cost = priced if self.cost is None else self.cost + priced

    def answer(self) -> dict[str, object]:
        return {"raw_gpu_minutes": self.raw_gpu_minutes, "gpu_minutes": self.gpu_minutes, "cost": self.cost}


@dataclass(slots=True)
class ClusterTotals:
    """Each cluster's totals and those of all, as the rows stream past."""

    clusters: dict[str, Totals] = field(default_factory=dict)
    all: Totals = field(default_factory=Totals)

    def add(self, row: dict[str, object]) -> None:
        self.clusters.setdefault(str(row["cluster"]), Totals()).add(row)
        self.all.add(row)

    def answer(self) -> dict[str, object]:
        by_cluster = [{"cluster": name} | self.clusters[name].answer() for name in sorted(self.clusters)]
        return {"by_cluster": by_cluster, "all": self.all.answer()}


async def as_json(
    span: ChargebackRange, currency: str, rows: AsyncIterator[dict[str, object]]
) -> AsyncIterator[bytes]:
    """{"since", "until", "currency", "rows": [...], "totals": {"by_cluster": [...], "all": {...}}}, written
    as the rows come (amounts as JSON numbers, as every other answer of the API); the totals last, once
    every row has been summed into them."""
    head = orjson.dumps(
        {"since": span.since, "until": span.until, "currency": currency}, option=orjson.OPT_UTC_Z
    )
    yield head[:-1] + b', "rows": ['
    totals = ClusterTotals()
    first = True
    async for row in rows:
        totals.add(row)
        yield (b"" if first else b",") + orjson.dumps(row, default=_json_default, option=orjson.OPT_UTC_Z)
        first = False
    yield b'], "totals": ' + orjson.dumps(totals.answer(), default=_json_default) + b"}"
