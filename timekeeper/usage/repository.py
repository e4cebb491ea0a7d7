"""SQL for the usage ledger: the ingest statements (each only reads or writes; what to charge is the
ingest service's plan) and the usage queries."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from functools import cache
from typing import Any, NamedTuple, Protocol, cast

import orjson
import psycopg
import sqlalchemy as sa
from psycopg.rows import namedtuple_row
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncSession

from gpuaccounting.wire import BudgetState
from timekeeper.budgets.repository import figures_of, figures_parameters, namespace_figures
from timekeeper.db.lists import arity, array_parameters, array_sql
from timekeeper.db.locks import NAMESPACE_ORDER_SQL
from timekeeper.db.pipeline import pipeline_connection, pipeline_sql
from timekeeper.domain.figures import NamespaceFigures, TotalKey
from timekeeper.domain.measurements import GroupBy, MeasurementSums
from timekeeper.domain.periods import Interval
from timekeeper.domain.weights import WeightTimeline
from timekeeper.usage.charge_inputs import (
    CHARGE_INPUTS,
    charge_inputs,
    charge_inputs_parameters,
    weight_timelines,
    weights,
    weights_parameters,
)
from timekeeper.usage.models import RUNNING_POD, PodCoverage

# The ingest statements run on the session's psycopg connection in pipeline mode (IngestStatements,
# timekeeper/db/pipeline.py): a batch reads in one round trip and writes in another. A batch
# holds at most one report per pod (ON CONFLICT may touch a row once per statement) and travels as one
# JSON array read by jsonb_to_recordset, in pod_uid order; every statement takes its locks in the one
# order of db/locks.py. Multiranges and jsonb_to_recordset keep these statements as text.
_PODS = (
    "jsonb_to_recordset(CAST(%(pods)s AS jsonb)) AS r(pod_uid text, namespace text, pod text, seq bigint, "
    "interval_start timestamptz, interval_end timestamptz, final boolean, gpu_model text, "
    "admitted_share numeric)"
)
_REPORTS = (
    "jsonb_to_recordset(CAST(%(reports)s AS jsonb)) AS r(pod_uid text, namespace text, pod text, seq bigint, "
    "interval_start timestamptz, interval_end timestamptz, final boolean, gpu_share numeric, "
    "gpu_minutes numeric, mean_sm_util_pct double precision, gpus jsonb, peak_sm_util_pct double precision, "
    "mem_used_bytes bigint, mean_power_w numeric, gpu_status_bits smallint, charge_share numeric, "
    "gpu_model text, covers boolean)"
)
# Creates each pod's row on its first report and locks it; answers the pieces of each interval not yet
# charged, one row each (one row of NULLs for a report whose time is all charged already). A pod_uid
# already known in another namespace is neither touched nor answered. `last_report_at` records a sign of
# life from the sidecar: a charge made without one (the reconciler's, for silent time) leaves it alone,
# and a pod first seen that way counts as silent since the start of that charge. The pod's GPU model is the
# first one known (billing weights), and so is its admitted share (the charge's): kept once known, and
# answered.
_LOCK_PODS = (
    f"WITH r AS (SELECT * FROM {_PODS}), locked AS ("
    "INSERT INTO pod_coverage (pod_uid, namespace, pod, covered, last_seq, last_report_at, final, gpu_model, "
    "admitted_share) "
    "SELECT pod_uid, namespace, pod, '{}', seq, "
    "CASE WHEN %(from_sidecar)s THEN CAST(%(now)s AS timestamptz) ELSE interval_start END, false, gpu_model, "
    "admitted_share FROM r ORDER BY pod_uid "
    "ON CONFLICT (pod_uid) DO UPDATE SET last_report_at = CASE WHEN %(from_sidecar)s "
    "THEN excluded.last_report_at ELSE pod_coverage.last_report_at END, "
    "gpu_model = coalesce(pod_coverage.gpu_model, excluded.gpu_model), "
    "admitted_share = coalesce(pod_coverage.admitted_share, excluded.admitted_share) "
    "WHERE pod_coverage.namespace = excluded.namespace "
    "RETURNING pod_uid, covered, gpu_model, admitted_share) "
    "SELECT r.pod_uid, lower(u.piece), upper(u.piece), locked.gpu_model, locked.admitted_share "
    "FROM r JOIN locked USING (pod_uid) "
    "LEFT JOIN LATERAL unnest(tstzmultirange(tstzrange(r.interval_start, r.interval_end)) - locked.covered) "
    "AS u(piece) ON true"
)
# The reports already in the ledger (a retry of the same pod_uid, seq and interval charges nothing). Run
# after _LOCK_PODS, as its own statement: its snapshot then sees every batch that held a pod's lock before.
# Each report's lookup is an index probe whatever the planner estimates: jsonb_to_recordset counts as
# 100 rows, so against a young ledger (the plan psycopg prepares is kept as the ledger grows) a join was
# planned as a hash join over a scan of the whole ledger; OFFSET 0 keeps the EXISTS a per-row subplan.
# The batch's span, as parameters, bounds interval_end (a retry has its original's interval): PostgreSQL
# then prunes the day partitions outside it before it locks or opens them, however many days are kept.
_REPEATED = (
    f"SELECT r.pod_uid FROM {_PODS} WHERE EXISTS (SELECT FROM usage_ledger l WHERE l.pod_uid = r.pod_uid "
    "AND l.seq = r.seq AND l.interval_start = r.interval_start AND l.interval_end = r.interval_end "
    "AND l.interval_end >= %(since)s AND l.interval_end <= %(until)s OFFSET 0)"
)
# A ledger row's columns, in the order ingest's insert and bench/history.py's bulk loader select them.
LEDGER_COLUMNS = (
    "namespace",
    "pod",
    "pod_uid",
    "seq",
    "interval_start",
    "interval_end",
    "gpu_share",
    "charged",
    "gpu_minutes",
    "final",
    "received_at",
    "mean_sm_util_pct",
    "gpus",
    "peak_sm_util_pct",
    "mem_used_bytes",
    "mean_power_w",
    "gpu_status_bits",
    "charge_share",
    "gpu_model",
)
INSERT_LEDGER = f"INSERT INTO usage_ledger ({', '.join(LEDGER_COLUMNS)})"
# One statement: each report's ledger row, charged the part of its interval its pod has not covered,
# and that interval added to its pod's coverage (reports whose time is all charged already add none).
# Every part of a statement reads one snapshot, so the insert reads each pod's coverage as it was before
# the update beside it; the pods are locked since _LOCK_PODS, so the update takes no lock out of order.
# ON CONFLICT stays as a guard: IngestStatements.write refuses the batch when a row it was sure was new
# did not go in. Pods are found by primary-key probes, not by joins the planner may make scans of every
# pod (jsonb_to_recordset counts as 100 rows, as in _REPEATED).
_CHARGE = (
    f"WITH r AS MATERIALIZED (SELECT * FROM {_REPORTS}), cover AS ("
    "UPDATE pod_coverage p SET covered = p.covered + tstzmultirange(tstzrange(r.interval_start, "
    "r.interval_end)), last_seq = r.seq, pod = r.pod, final = p.final OR r.final "
    "FROM r WHERE r.covers AND p.pod_uid = r.pod_uid "
    "AND p.pod_uid = ANY(ARRAY(SELECT pod_uid FROM r WHERE covers))) "
    f"{INSERT_LEDGER} "
    "SELECT r.namespace, r.pod, r.pod_uid, r.seq, r.interval_start, r.interval_end, r.gpu_share, "
    "tstzmultirange(tstzrange(r.interval_start, r.interval_end)) "
    "- (SELECT c.covered FROM pod_coverage c WHERE c.pod_uid = r.pod_uid), r.gpu_minutes, r.final, "
    "CAST(%(now)s AS timestamptz), r.mean_sm_util_pct, r.gpus, "
    "r.peak_sm_util_pct, r.mem_used_bytes, r.mean_power_w, r.gpu_status_bits, r.charge_share, r.gpu_model "
    "FROM r ON CONFLICT ON CONSTRAINT uq_usage_ledger_report DO NOTHING"
)
# Marks the pods whose report stated another share than the admitted one, once: answers those marked now
# (their pods are locked since _LOCK_PODS).
_MISMATCHED = (
    "UPDATE pod_coverage SET share_mismatch_at = CAST(%(now)s AS timestamptz) "
    "WHERE pod_uid = ANY(%(pod_uids)s) AND share_mismatch_at IS NULL RETURNING pod_uid"
)
# Adds to the running totals in key order (db/locks.py); answers each total afterwards.
_ADD_USED = (
    "INSERT INTO usage_totals (namespace, period_kind, period_start, used_gpu_minutes) "
    "SELECT * FROM jsonb_to_recordset(CAST(%(totals)s AS jsonb)) "
    "AS t(namespace text, period_kind text, period_start timestamptz, used numeric) ORDER BY 1, 2, 3 "
    "ON CONFLICT (namespace, period_kind, period_start) "
    "DO UPDATE SET used_gpu_minutes = usage_totals.used_gpu_minutes + excluded.used_gpu_minutes "
    "RETURNING namespace, period_kind, period_start, used_gpu_minutes, granted_gpu_minutes"
)
# Adds to the forecast's burn buckets (budgets/burn.py), after the totals (db/locks.py).
_ADD_BURN = (
    "INSERT INTO usage_burn (namespace, bucket_start, gpu_minutes) "
    "SELECT * FROM jsonb_to_recordset(CAST(%(burn)s AS jsonb)) "
    "AS b(namespace text, bucket_start timestamptz, gpu_minutes numeric) ORDER BY 1, 2 "
    "ON CONFLICT (namespace, bucket_start) "
    "DO UPDATE SET gpu_minutes = usage_burn.gpu_minutes + excluded.gpu_minutes"
)


# The namespaces' stored states, locked after the totals and burn buckets (db/locks.py).
@cache
def lock_states(arity: int | None) -> str:
    return pipeline_sql(
        sa.text(
            "SELECT namespace, state FROM namespace_status "
            f"WHERE namespace = ANY({array_sql('namespace', arity)}) "
            f"ORDER BY {NAMESPACE_ORDER_SQL} FOR UPDATE"
        )
    )


# Raw ledger rows and the hourly per-pod aggregates the roll-up job folds old rows into, in one shape:
# a report counts once per aggregate (an aggregate row counts the reports folded into its hour). Each
# additive figure is a value for `per` seconds of the source's charged time: a ledger row's per second
# (its utilisation, memory, power; 1 where it has the figure), an aggregate's for its whole charged time
# (its sums), so the seconds of a bucket or window take their part (all of it for a whole hour, exactly).
_SOURCE_OF = (
    "SELECT 'l' || l.id AS id, l.namespace, l.pod, l.pod_uid, l.gpu_share, l.charge_share, l.gpu_model, "
    "l.charged, "
    "1 AS reports, 1 AS per, "
    "l.mean_sm_util_pct AS util, CAST(l.mean_sm_util_pct IS NOT NULL AS int) AS util_covered, "
    "coalesce(l.peak_sm_util_pct, l.mean_sm_util_pct) AS util_peak, l.mem_used_bytes AS mem, "
    "CAST(l.mem_used_bytes IS NOT NULL AS int) AS mem_covered, l.mem_used_bytes AS mem_peak, "
    "l.mean_power_w AS energy, l.gpu_status_bits AS status_bits "
    "FROM usage_ledger l "
    "WHERE {namespace_of_l} AND l.interval_end > :since AND l.interval_start < :until "
    "UNION ALL SELECT 'h' || h.id, h.namespace, h.pod, h.pod_uid, h.gpu_share, h.charge_share, h.gpu_model, "
    "h.charged, "
    "h.reports, (SELECT sum(extract(epoch FROM upper(c) - lower(c))) FROM unnest(h.charged) AS c), "
    "h.util_seconds, h.util_covered_seconds, h.peak_sm_util_pct, h.mem_byte_seconds, h.mem_covered_seconds, "
    "h.peak_mem_used_bytes, h.energy_joules, h.gpu_status_bits "
    "FROM usage_hourly h WHERE {namespace_of_h} "
    "AND h.hour_start > CAST(:since AS timestamptz) - interval '1 hour' AND h.hour_start < :until"
)
_USAGE_SOURCE = _SOURCE_OF.format(
    namespace_of_l="l.namespace = :namespace", namespace_of_h="h.namespace = :namespace"
)
# The same over the namespaces in :namespaces (a text[]; NULL: every namespace).
_USAGE_SOURCE_OF_NAMESPACES = _SOURCE_OF.format(
    namespace_of_l="(CAST(:namespaces AS text[]) IS NULL OR l.namespace = ANY(CAST(:namespaces AS text[])))",
    namespace_of_h="(CAST(:namespaces AS text[]) IS NULL OR h.namespace = ANY(CAST(:namespaces AS text[])))",
)
UNKNOWN_MODEL = "unknown"
_USAGE_PIECE = {
    "pod": ("s.pod", "r", ""),
    "model": (f"coalesce(s.gpu_model, '{UNKNOWN_MODEL}')", "r", ""),
    # The pod's workload as the pod watch recorded it (reconcile/workloads.py), else the pod itself.
    "workload": (
        "coalesce(w.workload, 'Pod/' || s.pod)",
        "r",
        "LEFT JOIN pod_coverage w ON w.pod_uid = s.pod_uid",
    ),
    "hour": (
        'to_char(b, \'YYYY-MM-DD"T"HH24:00:00"Z"\')',
        "r * tstzrange(b, b + interval '1 hour')",
        "CROSS JOIN LATERAL generate_series(date_trunc('hour', lower(r), 'UTC'), "
        "upper(r) - interval '1 microsecond', interval '1 hour') AS b",
    ),
    "day": (
        "to_char(b, 'YYYY-MM-DD')",
        "r * tstzrange(b, b + interval '1 day')",
        "CROSS JOIN LATERAL generate_series(date_trunc('day', lower(r), 'UTC'), "
        "upper(r) - interval '1 microsecond', interval '1 day') AS b",
    ),
}


# Each weighted GPU model's changes, in order, joined to the sources of that model: a source whose charged
# time lies between two changes (one bucket of width_bucket) takes the weight in force there (1 before the
# first) for all its pieces, exactly what gpu_weighted_seconds answers for them, without the function's
# lookup per piece, which cost most of a long export. One row per model: a nested loop over it stays short.
_SOURCE_WEIGHT = (
    "LEFT JOIN (SELECT model, array_agg(effective_from ORDER BY effective_from) AS froms, "
    "array_agg(weight ORDER BY effective_from) AS weights FROM gpu_weights GROUP BY model) AS wc "
    "ON wc.model = s.gpu_model"
)
_IN_ONE_SPAN = (
    "width_bucket(lower(s.charged), wc.froms) "
    "= width_bucket(upper(s.charged) - interval '1 microsecond', wc.froms)"
)


def _piece_figures(piece: str) -> dict[str, str]:
    """A piece's share-seconds, charged seconds and seconds. The charge counts a model never weighted as it
    is, a source inside one weight span at that weight (_SOURCE_WEIGHT), a piece crossing a change by
    gpu_weighted_seconds."""
    seconds = f"extract(epoch FROM upper({piece}) - lower({piece}))"
    return {
        "share_seconds": f"s.gpu_share * {seconds}",
        "charged_seconds": f"s.charge_share * CASE WHEN wc.model IS NULL THEN {seconds} "
        f"WHEN {_IN_ONE_SPAN} THEN coalesce(wc.weights[width_bucket(lower(s.charged), wc.froms)], 1) "
        f"* {seconds} ELSE gpu_weighted_seconds(s.gpu_model, {piece}) END",
        "seconds": seconds,
    }


def _piece_sums(piece: str) -> str:
    """A source's figures summed over its pieces `piece` (grouped per source)."""
    return ", ".join(f"sum({figure}) AS {name}" for name, figure in _piece_figures(piece).items())


def _period_sums(period: str) -> str:
    """A source's figures in `period` (a tstzrange it overlaps), without grouping: a source whose charged
    time is one range (nearly all) is cut by range arithmetic; only one with gaps is unnested."""
    one = _piece_figures(f"(range_merge(s.charged) * {period})")
    pieces = _piece_figures("r")
    return ", ".join(
        f"CASE WHEN s.charged = tstzmultirange(range_merge(s.charged)) THEN {one[name]} "
        f"ELSE (SELECT sum({pieces[name]}) FROM unnest(s.charged * tstzmultirange({period})) AS r) "
        f"END AS {name}"
        for name in pieces
    )


# A source's own figures (one value per source: max() of one value where grouped).
_SOURCE_FIGURES = (
    "max(s.per) AS per, max(s.reports) AS reports, max(s.util) AS util, max(s.util_covered) AS util_covered, "
    "max(s.util_peak) AS util_peak, max(s.mem) AS mem, max(s.mem_covered) AS mem_covered, "
    "max(s.mem_peak) AS mem_peak, max(s.energy) AS energy, max(s.status_bits) AS status_bits"
)
# A usage row from its sources' sums: minutes rounded once per row.
_TOTALS = (
    "round(sum(charged_seconds) / 60, 9) AS minutes, "
    "round(sum(share_seconds) / 60, 9) AS raw_minutes, sum(reports) AS reports, "
    "sum(util * seconds / per) AS util_seconds, "
    "coalesce(sum(util_covered * seconds / per), 0) AS util_covered_seconds, "
    "max(util_peak) AS util_peak, sum(mem * seconds / per) AS mem_byte_seconds, "
    "coalesce(sum(mem_covered * seconds / per), 0) AS mem_covered_seconds, "
    "max(mem_peak) AS mem_peak, sum(energy * seconds / per) AS energy_joules, "
    "bit_or(status_bits) AS status_bits"
)
# usage(..., "workload"): the rows per workload and pod (_TOTALS, rounded per pod as usage by pod rounds
# them) summed per workload, so a workload's GPU-minutes are exactly the sum of its pods' rows.
_BY_WORKLOAD = (
    "sum(minutes) AS minutes, sum(raw_minutes) AS raw_minutes, sum(reports) AS reports, "
    "sum(util_seconds) AS util_seconds, sum(util_covered_seconds) AS util_covered_seconds, "
    "max(util_peak) AS util_peak, sum(mem_byte_seconds) AS mem_byte_seconds, "
    "sum(mem_covered_seconds) AS mem_covered_seconds, max(mem_peak) AS mem_peak, "
    "sum(energy_joules) AS energy_joules, bit_or(status_bits) AS status_bits"
)
# usage(..., "model") of many namespaces and periods at once (:starts and :ends, the bounds of contiguous
# periods in order): each source finds the periods its charged time touches by binary search in :starts
# (width_bucket), its figures in each (_period_sums) one row, then one usage row per period, namespace
# and model. OFFSET 0 keeps per_source a subquery: pulled up, each figure would be computed again for
# every use of it in _TOTALS.
_PERIOD = "tstzrange(b.starts[k], b.ends[k])"
_USAGE_BY_PERIOD = sa.text(
    f"WITH source AS ({_USAGE_SOURCE_OF_NAMESPACES}), b AS ("
    "SELECT CAST(:starts AS timestamptz[]) AS starts, CAST(:ends AS timestamptz[]) AS ends), per_source AS ("
    f"SELECT b.starts[k] AS period_start, s.namespace, {_USAGE_PIECE['model'][0]} AS key, "
    f"{_period_sums(_PERIOD)}, "
    "s.per, s.reports, s.util, s.util_covered, s.util_peak, s.mem, s.mem_covered, s.mem_peak, s.energy, "
    f"s.status_bits FROM source s {_SOURCE_WEIGHT} CROSS JOIN b "
    "CROSS JOIN LATERAL generate_series(greatest(width_bucket(lower(s.charged), b.starts), 1), "
    "width_bucket(upper(s.charged) - interval '1 microsecond', b.starts)) AS k "
    f"WHERE s.charged && {_PERIOD} OFFSET 0) "
    f"SELECT period_start, namespace, key, {_TOTALS} FROM per_source "
    "GROUP BY period_start, namespace, key ORDER BY period_start, namespace, key"
)
_STREAMED_ROWS = 1000  # rows fetched from the server-side cursor at a time

# Per pod over [since, until): allocation (share x charged seconds), the allocation of the seconds that had a
# utilisation figure, and that allocation x the mean SM utilisation, each as share-seconds rounded once to
# GPU-minutes (as the usage answer's minutes are). A source's figures stand for `per` seconds (see above).
_EFFICIENCY = sa.text(
    f"WITH source AS ({_USAGE_SOURCE}), per_source AS ("
    "SELECT s.pod, s.id, max(s.gpu_share) AS share, max(s.per) AS per, max(s.util) AS util, "
    "max(s.util_covered) AS util_covered, sum(extract(epoch FROM upper(r) - lower(r))) AS seconds "
    "FROM source s CROSS JOIN LATERAL unnest(s.charged * tstzmultirange(tstzrange(:since, :until))) AS r "
    "GROUP BY 1, 2) "
    "SELECT pod, round(sum(share * seconds) / 60, 9) AS allocated, "
    "round(coalesce(sum(share * util_covered * seconds / per), 0) / 60, 9) AS measured, "
    "round(coalesce(sum(share * util * seconds / per), 0) / 6000, 9) AS utilised "
    "FROM per_source GROUP BY pod ORDER BY pod"
)
# SQLAlchemy leaves its dialects' constructors untyped.
_RUNNING = str(RUNNING_POD.compile(dialect=postgresql.dialect()))  # type: ignore[no-untyped-call]
# Running pods that have held their GPUs since before :held_since (their first charged time) and whose
# utilisation over [:held_since, :now) is known; the caller keeps those below the threshold. Raw rows
# only: the window is far younger than the roll-up's retention.
_HELD = sa.text(
    "WITH pods AS (SELECT namespace, pod, pod_uid, lower(covered) AS held_from FROM pod_coverage "
    "WHERE (CAST(:namespaces AS text[]) IS NULL OR namespace = ANY(CAST(:namespaces AS text[]))) "
    f"AND {_RUNNING} AND NOT isempty(covered) AND lower(covered) <= :held_since), pieces AS ("
    "SELECT l.pod_uid, l.gpu_share, l.mean_sm_util_pct AS util, "
    "extract(epoch FROM upper(r) - lower(r)) AS seconds FROM pods "
    "JOIN usage_ledger l ON l.pod_uid = pods.pod_uid AND l.namespace = pods.namespace "
    "AND l.interval_end > :held_since AND l.interval_start < :now "
    "CROSS JOIN LATERAL unnest(l.charged * tstzmultirange(tstzrange(:held_since, :now))) AS r) "
    "SELECT pods.namespace, pods.pod, pods.pod_uid, pods.held_from, max(x.gpu_share) AS gpu_share, "
    "round(sum(x.gpu_share * x.seconds) / 60, 9) AS allocated, "
    "sum(x.util * x.seconds) FILTER (WHERE x.util IS NOT NULL) "
    "/ sum(x.seconds) FILTER (WHERE x.util IS NOT NULL) AS mean_util "
    "FROM pods JOIN pieces x USING (pod_uid) GROUP BY 1, 2, 3, 4 "
    "HAVING count(x.util) > 0 ORDER BY 1, 2, 3"
)


def by_period_parameters(
    namespaces: Sequence[str] | None, periods: Sequence[tuple[datetime, datetime]]
) -> dict[str, Any]:
    """_USAGE_BY_PERIOD's parameters: the namespaces (None: all) and the periods' bounds, in order."""
    return {
        "namespaces": None if namespaces is None else list(namespaces),
        "starts": [start for start, _ in periods],
        "ends": [end for _, end in periods],
        "since": min(start for start, _ in periods),
        "until": max(end for _, end in periods),
    }


class UsageFound(NamedTuple):
    key: str
    gpu_minutes: Decimal
    raw_gpu_minutes: Decimal
    reports: int
    figures: MeasurementSums


def usage_found(row: Any) -> UsageFound:
    """A usage row as the queries' _TOTALS columns give it."""
    return UsageFound(
        row.key,
        row.minutes,
        row.raw_minutes,
        int(row.reports),
        MeasurementSums(
            util_seconds=row.util_seconds,
            util_covered_seconds=row.util_covered_seconds,
            peak_sm_util_pct=row.util_peak,
            mem_byte_seconds=row.mem_byte_seconds,
            mem_covered_seconds=row.mem_covered_seconds,
            peak_mem_used_bytes=None if row.mem_peak is None else int(row.mem_peak),
            energy_joules=row.energy_joules,
            gpu_status_bits=int(row.status_bits),
        ),
    )


@dataclass(frozen=True, slots=True)
class PodEfficiency:
    pod: str
    allocated_gpu_minutes: Decimal
    measured_gpu_minutes: Decimal  # the allocation of the time that had a utilisation figure
    utilised_gpu_minutes: Decimal  # that allocation x its mean SM utilisation


@dataclass(frozen=True, slots=True)
class HeldPod:
    namespace: str
    pod: str
    pod_uid: str
    held_from: datetime
    gpu_share: Decimal
    allocated_gpu_minutes: Decimal  # inside the window
    mean_sm_util_pct: Decimal  # over the window's time that had the figure


def repeated_parameters(pods: str, span: Interval) -> dict[str, Any]:
    """_REPEATED's parameters: the batch's pods and its span (every interval_end lies inside it)."""
    return {"pods": pods, "since": span[0], "until": span[1]}


def batch_json(rows: Sequence[Mapping[str, Any]]) -> str:
    """A batch's rows as the one JSON parameter its statements read with jsonb_to_recordset: encoded in
    C, rather than a Python-dumped array per column."""
    return orjson.dumps(rows).decode()


class BatchPod(Protocol):
    """A report's record as the batch's statements fill it (usage/service.py BatchEntry): what was read
    with its pod locked, and whether the write first marked its share mismatch."""

    @property
    def pod_uid(self) -> str: ...

    uncovered: list[Interval] | None  # its interval's time not yet charged; None: another namespace's pod
    model: str | None  # the GPU model known for its pod
    admitted: Decimal | None  # its pod's admitted share, when known
    repeated: bool  # its report is in the ledger already
    mismatch_marked: bool  # its pod's share mismatch was first marked by this batch


@dataclass(frozen=True, slots=True)
class BatchRead:
    """What a batch's plan needs beside its reports' own records, read with its pods locked."""

    figures: list[NamespaceFigures]  # each namespace of the batch
    weights: Mapping[str, WeightTimeline]  # the weight timelines of the batch's models over its intervals
    bases: dict[str, tuple[str, Decimal]]  # the charge basis rows of the batch's namespaces and cluster


@dataclass(frozen=True, slots=True)
class BatchWritten:
    totals: list[tuple[TotalKey, Decimal, Decimal]]  # (used, granted) of each total the batch added to
    states: dict[str, BudgetState]  # as stored, locked: the namespaces asked for that have a state yet


class IngestStatements:
    """The ingest statements, on the session's own psycopg connection (so in its transaction) in
    pipeline mode: a batch costs one round trip to read and one to write, whatever its size. They only
    read or write; what to charge is the caller's plan."""

    def __init__(self, connection: psycopg.AsyncConnection[Any]) -> None:
        self.connection = connection

    @classmethod
    async def of(cls, session: AsyncSession) -> IngestStatements:
        return cls(await pipeline_connection(session))

    async def read(
        self,
        records: Sequence[BatchPod],
        pods: str,
        namespaces: list[str],
        span: Interval,
        now: datetime,
        *,
        from_sidecar: bool,
    ) -> BatchRead:
        """Lock (creating on first sight) the batch's pods and read, in one round trip (two when a pod's model
        is not the one its report names): the namespaces' figures and charge bases, each report's time not yet
        charged, each pod's GPU model and admitted share, the models' weights, and which reports repeat. The
        per-report answers fill `records` (`pods`: their pod rows as batch_json)."""
        connection = self.connection
        # The pipeline's exit sends the one Sync and reads every result into its cursor: a sync() inside
        # the block would cost a round trip of its own, the exit's (docs/performance.md, "One sync").
        async with connection.pipeline():
            figures = connection.cursor(row_factory=namedtuple_row)
            await figures.execute(
                pipeline_sql(figures_of(arity(len(namespaces)))), figures_parameters(now, namespaces)
            )
            locked = await connection.execute(
                _LOCK_PODS, {"pods": pods, "now": now, "from_sidecar": from_sidecar}
            )
            billing = await connection.execute(
                CHARGE_INPUTS, charge_inputs_parameters(pods, namespaces, *span)
            )
            repeated = await connection.execute(_REPEATED, repeated_parameters(pods, span))
        by_uid = {record.pod_uid: record for record in records}
        models: set[str | None] = set()
        for pod_uid, lower, upper, model, share in await locked.fetchall():
            record = by_uid[pod_uid]
            if record.uncovered is None:
                record.uncovered, record.model, record.admitted = [], model, share
                models.add(model)
            if lower is not None:
                record.uncovered.append((lower, upper))
        for (pod_uid,) in await repeated.fetchall():
            by_uid[pod_uid].repeated = True
        inputs = charge_inputs(await billing.fetchone())
        read = BatchRead(
            [namespace_figures(row) for row in await figures.fetchall()], inputs.weights, inputs.bases
        )
        unread = inputs.unread(models)
        if not unread:
            return read
        # A pod whose model was known before and is not what its report names (or names none).
        cursor = await connection.execute(
            weights(arity(len(unread))), weights_parameters(sorted(unread), *span)
        )
        row = await cursor.fetchone()
        assert row is not None, "an aggregate answers one row"
        return replace(read, weights={**read.weights, **weight_timelines(row[0])})

    async def write(
        self,
        reports: str,
        count: int,
        totals: str | None,
        namespaces: list[str],
        now: datetime,
        burn: str | None = None,
        mismatched: Sequence[BatchPod] = (),
    ) -> BatchWritten:
        """Write a batch's plan in one round trip: ledger rows, coverage, totals, burn buckets, share
        mismatches marked once (the records of `mismatched`, in pod_uid order, whose pods are marked now
        are told so). Answers each total afterwards and the stored states of `namespaces` locked until the
        commit (so the caller writes only states that change)."""
        connection = self.connection
        async with connection.pipeline():  # one Sync, at the exit (as in read)
            inserted = await connection.execute(_CHARGE, {"reports": reports, "now": now})
            added = None if totals is None else await connection.execute(_ADD_USED, {"totals": totals})
            if burn is not None:
                await connection.execute(_ADD_BURN, {"burn": burn})
            states = (
                await connection.execute(
                    lock_states(arity(len(namespaces))), array_parameters("namespace", namespaces)
                )
                if namespaces
                else None
            )
            marked = (
                await connection.execute(
                    _MISMATCHED, {"pod_uids": [record.pod_uid for record in mismatched], "now": now}
                )
                if mismatched
                else None
            )
        if inserted.rowcount != count:  # a repeat the read did not see: never charge it twice
            raise RuntimeError(f"{count - inserted.rowcount} ledger rows of the batch were there already")
        if marked is not None:
            by_uid = {record.pod_uid: record for record in mismatched}
            for (pod_uid,) in await marked.fetchall():
                by_uid[pod_uid].mismatch_marked = True
        return BatchWritten(
            []
            if added is None
            else [
                ((ns, kind, start), used, granted)
                for ns, kind, start, used, granted in await added.fetchall()
            ],
            {}
            if states is None
            else {namespace: cast(BudgetState, state) for namespace, state in await states.fetchall()},
        )


class UsageRepository:
    """The usage queries, and the owners of refused pod_uids."""

    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def owners(self, pod_uids: Sequence[str]) -> dict[str, str]:
        """The namespace each pod_uid reports for."""
        result = await self.session.execute(
            sa.select(PodCoverage.pod_uid, PodCoverage.namespace).where(PodCoverage.pod_uid.in_(pod_uids))
        )
        return dict(result.tuples().all())

    async def usage(
        self, namespace: str, since: datetime, until: datetime, group_by: GroupBy
    ) -> list[UsageFound]:
        """Charged GPU-minutes (weighted, at the charge basis) and raw ones (share x time) inside
        [since, until), exactly, grouped by pod, workload (its pods' rows, rounded as by pod, summed), hour,
        day or model, with the measurements' sums over the same seconds; ledger and hourly rows alike."""
        key, piece, bucket = _USAGE_PIECE[group_by]
        if group_by == "workload":  # rounded per pod, as usage by pod rounds, then summed per workload
            per_pod = f"SELECT key, pod, {_TOTALS} FROM per_source GROUP BY 1, 2"
            rows = f"SELECT key, {_BY_WORKLOAD} FROM ({per_pod}) AS per_pod"
        else:
            rows = f"SELECT key, {_TOTALS} FROM per_source"
        query = sa.text(
            f"WITH source AS ({_USAGE_SOURCE}), per_source AS ("
            f"SELECT {key} AS key, s.pod, s.id, {_piece_sums(piece)}, {_SOURCE_FIGURES} "
            f"FROM source s {_SOURCE_WEIGHT} "
            "CROSS JOIN LATERAL unnest(s.charged * tstzmultirange(tstzrange(:since, :until))) AS r "
            f"{bucket} GROUP BY 1, 2, 3) "
            f"{rows} GROUP BY key ORDER BY key"
        )
        result = await self.session.execute(query, {"namespace": namespace, "since": since, "until": until})
        return [usage_found(row) for row in result]

    async def usage_by_period(
        self, namespaces: Sequence[str] | None, periods: Sequence[tuple[datetime, datetime]]
    ) -> AsyncIterator[tuple[datetime, str, UsageFound]]:
        """usage(namespace, start, end, "model") of every namespace (None: all) and period, as one
        statement streamed from a server-side cursor: (period start, namespace, row) in that order."""
        result = await self.session.stream(
            _USAGE_BY_PERIOD.execution_options(yield_per=_STREAMED_ROWS),
            by_period_parameters(namespaces, periods),
        )
        async for row in result:
            yield row.period_start, row.namespace, usage_found(row)

    async def efficiency(self, namespace: str, since: datetime, until: datetime) -> list[PodEfficiency]:
        """Per pod over [since, until): allocated, measured and utilised GPU-minutes, exactly (raw rows and
        hourly aggregates alike)."""
        result = await self.session.execute(
            _EFFICIENCY, {"namespace": namespace, "since": since, "until": until}
        )
        return [PodEfficiency(row.pod, row.allocated, row.measured, row.utilised) for row in result]

    async def held_pods(
        self, namespaces: Sequence[str] | None, held_since: datetime, now: datetime
    ) -> list[HeldPod]:
        """Running pods (of the namespaces, or all) holding GPUs since held_since or earlier, with their
        allocation and mean utilisation over [held_since, now) where they reported one."""
        result = await self.session.execute(
            _HELD,
            {
                "namespaces": None if namespaces is None else list(namespaces),
                "held_since": held_since,
                "now": now,
            },
        )
        return [
            HeldPod(
                row.namespace,
                row.pod,
                row.pod_uid,
                row.held_from,
                row.gpu_share,
                row.allocated,
                row.mean_util,
            )
            for row in result
        ]

    async def running_pods_without_model(self) -> dict[str, int]:
        """Per namespace, the running pods no source has named a GPU model for (they count weight 1)."""
        result = await self.session.execute(
            sa.select(PodCoverage.namespace, sa.func.count())
            .where(RUNNING_POD, PodCoverage.gpu_model.is_(None))
            .group_by(PodCoverage.namespace)
        )
        return dict(result.tuples().all())
