"""SQL for the usage ledger: the ingest statements (each only reads or writes; what to charge is the
ingest service's plan) and the usage queries."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
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
from timekeeper.domain.figures import ModelTotalKey, NamespaceFigures, TotalKey
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
# answered, and whether the report's seq is the pod's last one charged (a retry whose raw row is gone).
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
    "RETURNING pod_uid, covered, gpu_model, admitted_share, last_seq) "
    "SELECT r.pod_uid, lower(u.piece), upper(u.piece), locked.gpu_model, locked.admitted_share, "
    "locked.last_seq = r.seq "
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
# The GPU models of a batch given their small keys (usage_models), before _CHARGE reads them: its own
# statement, so _CHARGE's snapshot sees a key another batch created (ON CONFLICT waits for its commit).
_ADD_MODELS = (
    "INSERT INTO usage_models (name) SELECT m FROM unnest(CAST(%(models)s AS text[])) AS m "
    "WHERE NOT EXISTS (SELECT FROM usage_models WHERE name = m) ORDER BY 1 ON CONFLICT (name) DO NOTHING"
)
# The hourly aggregate a charge adds to, set by set: the figures of one report's charged time in one hour
# (`piece`, its `seconds`; continued: the report has charged time in an earlier hour too, so a bucket
# holding both counts it once), as domain/measurements.py folds them (figure x seconds beside the seconds
# that had it; maxima; statuses seen). The roll-up's fold of old ledger rows (migration 9a4c6e2f1b37)
# computed the same sums.
_ADD_FIGURES = (
    "charged = h.charged + excluded.charged, reports = h.reports + excluded.reports, "
    "reports_continued = h.reports_continued + excluded.reports_continued, "
    "util_seconds = coalesce(h.util_seconds + excluded.util_seconds, h.util_seconds, excluded.util_seconds), "
    "util_covered_seconds = h.util_covered_seconds + excluded.util_covered_seconds, "
    "peak_sm_util_pct = greatest(h.peak_sm_util_pct, excluded.peak_sm_util_pct), "
    "mem_byte_seconds = coalesce(h.mem_byte_seconds + excluded.mem_byte_seconds, h.mem_byte_seconds, "
    "excluded.mem_byte_seconds), "
    "mem_covered_seconds = h.mem_covered_seconds + excluded.mem_covered_seconds, "
    "peak_mem_used_bytes = greatest(h.peak_mem_used_bytes, excluded.peak_mem_used_bytes), "
    "energy_joules = coalesce(h.energy_joules + excluded.energy_joules, h.energy_joules, "
    "excluded.energy_joules), "
    "gpu_status_bits = h.gpu_status_bits | excluded.gpu_status_bits"
)
ADD_HOUR = f"ON CONFLICT ON CONSTRAINT uq_usage_pod_hours_key DO UPDATE SET {_ADD_FIGURES}"
HOUR_COLUMNS = (
    "pod_key",
    "hour_start",
    "gpu_share",
    "charge_share",
    "model_key",
    "charged",
    "reports",
    "reports_continued",
    "util_seconds",
    "util_covered_seconds",
    "peak_sm_util_pct",
    "mem_byte_seconds",
    "mem_covered_seconds",
    "peak_mem_used_bytes",
    "energy_joules",
    "gpu_status_bits",
)
_FIGURE_COLUMNS = HOUR_COLUMNS[8:]
# Folds one hour's pod-hours (:hour) into their days (usage_pod_days, fold_hours' rows older than
# TIMEKEEPER_HOURLY_HISTORY): moved by one statement, so an hour is in the hours or in its day, never both
# or neither. A day row adds the figures as the hours do (_ADD_FIGURES) and counts each report once: an
# hour's reports continued from the hour before are already counted there, inside the same day, except
# those of the day's first hour, which stay `reports_continued` (counted in the day before). A late
# report's hour, folded later into a day that has its row, adds the same way.
FOLD_HOUR = (
    "WITH moved AS (DELETE FROM usage_pod_hours WHERE hour_start = :hour RETURNING *) "
    f"INSERT INTO usage_pod_days AS h (pod_key, day_start, {', '.join(HOUR_COLUMNS[2:])}) "
    "SELECT pod_key, date_trunc('day', hour_start, 'UTC'), gpu_share, charge_share, model_key, charged, "
    "reports - CASE WHEN hour_start > date_trunc('day', hour_start, 'UTC') "
    "THEN reports_continued ELSE 0 END, "
    "CASE WHEN hour_start > date_trunc('day', hour_start, 'UTC') THEN 0 ELSE reports_continued END, "
    f"{', '.join(_FIGURE_COLUMNS)} FROM moved ORDER BY pod_key, gpu_share, charge_share, model_key "
    f"ON CONFLICT ON CONSTRAINT uq_usage_pod_days_key DO UPDATE SET {_ADD_FIGURES}"
)
# The rows of `fresh` (pod_key, gpu_share, charge_share, model_key, charged, util and util_peak as the
# ledger's numeric(6,3), mem_used_bytes, mean_power_w, gpu_status_bits)
# split at hour boundaries into aggregate rows, in key order. A batch holds one report per pod, so no
# aggregate is touched twice by one statement. bench/history.py's bulk loader adds its rows with the same
# HOUR_COLUMNS and ADD_HOUR.
_HOURS_OF_FRESH = (
    f"INSERT INTO usage_pod_hours AS h ({', '.join(HOUR_COLUMNS)}) "
    "SELECT f.pod_key, b, f.gpu_share, f.charge_share, f.model_key, x.piece, 1, "
    "CAST(b > date_trunc('hour', lower(f.charged), 'UTC') AS int), "
    "f.util * x.seconds, CASE WHEN f.util IS NULL THEN 0 ELSE x.seconds END, "
    "coalesce(f.util_peak, f.util), f.mem_used_bytes * x.seconds, "
    "CASE WHEN f.mem_used_bytes IS NULL THEN 0 ELSE x.seconds END, f.mem_used_bytes, "
    "f.mean_power_w * x.seconds, f.gpu_status_bits "
    "FROM fresh f CROSS JOIN LATERAL generate_series(date_trunc('hour', lower(f.charged), 'UTC'), "
    "upper(f.charged) - interval '1 microsecond', interval '1 hour') AS b "
    "CROSS JOIN LATERAL (SELECT f.charged * tstzmultirange(tstzrange(b, b + interval '1 hour')) AS piece) "
    "AS p "
    "CROSS JOIN LATERAL (SELECT p.piece, (SELECT sum(extract(epoch FROM upper(q) - lower(q))) "
    "FROM unnest(p.piece) AS q) AS seconds) AS x "
    f"WHERE NOT isempty(x.piece) ORDER BY 1, 2 {ADD_HOUR}"
)
# One statement: each report's charge (the part of its interval its pod has not covered) added to its
# pod's hourly aggregates, its ledger row where it ends inside the raw window (after :raw_since; NULL:
# none kept), and that interval added to its pod's coverage (reports whose time is all charged already
# add none). Every part of a statement reads one snapshot, so the aggregates and the insert read each
# pod's coverage as it was before the update beside it; the pods are locked since _LOCK_PODS, so the
# update takes no lock out of order. ON CONFLICT stays as a guard: IngestStatements.write refuses the
# batch when a row it was sure was new did not go in. Pods are found by primary-key probes, not by joins
# the planner may make scans of every pod (jsonb_to_recordset counts as 100 rows; OFFSET 0 keeps the
# lateral subquery a probe per report, as in _REPEATED).
_CHARGE = (
    f"WITH r AS MATERIALIZED (SELECT * FROM {_REPORTS}), cover AS ("
    "UPDATE pod_coverage p SET covered = p.covered + tstzmultirange(tstzrange(r.interval_start, "
    "r.interval_end)), last_seq = r.seq, pod = r.pod, final = p.final OR r.final "
    "FROM r WHERE r.covers AND p.pod_uid = r.pod_uid "
    "AND p.pod_uid = ANY(ARRAY(SELECT pod_uid FROM r WHERE covers))), "
    "fresh AS MATERIALIZED (SELECT r.*, c.id AS pod_key, "
    "tstzmultirange(tstzrange(r.interval_start, r.interval_end)) - c.covered AS charged, "
    "(SELECT m.id FROM usage_models m WHERE m.name = r.gpu_model) AS model_key, "
    "CAST(r.mean_sm_util_pct AS numeric(6, 3)) AS util, "
    "CAST(r.peak_sm_util_pct AS numeric(6, 3)) AS util_peak "
    "FROM r "
    "CROSS JOIN LATERAL (SELECT id, covered FROM pod_coverage c WHERE c.pod_uid = r.pod_uid OFFSET 0) AS c), "
    f"hours AS ({_HOURS_OF_FRESH}) "
    f"{INSERT_LEDGER} "
    "SELECT r.namespace, r.pod, r.pod_uid, r.seq, r.interval_start, r.interval_end, r.gpu_share, "
    "r.charged, r.gpu_minutes, r.final, "
    "CAST(%(now)s AS timestamptz), r.mean_sm_util_pct, r.gpus, "
    "r.peak_sm_util_pct, r.mem_used_bytes, r.mean_power_w, r.gpu_status_bits, r.charge_share, r.gpu_model "
    "FROM fresh r WHERE r.interval_end > CAST(%(raw_since)s AS timestamptz) "
    "ON CONFLICT ON CONSTRAINT uq_usage_ledger_report DO NOTHING"
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
# Adds to the per-model totals, after the totals, in key order; answers each afterwards.
_ADD_MODEL_USED = (
    "INSERT INTO usage_model_totals (namespace, period_kind, period_start, model, used_gpu_minutes) "
    "SELECT * FROM jsonb_to_recordset(CAST(%(totals)s AS jsonb)) "
    "AS t(namespace text, period_kind text, period_start timestamptz, model text, used numeric) "
    "ORDER BY 1, 2, 3, 4 ON CONFLICT (namespace, period_kind, period_start, model) "
    "DO UPDATE SET used_gpu_minutes = usage_model_totals.used_gpu_minutes + excluded.used_gpu_minutes "
    "RETURNING namespace, period_kind, period_start, model, used_gpu_minutes"
)
# Adds to the forecast's burn buckets (budgets/burn.py), after the totals (db/locks.py).
_ADD_BURN = (
    "INSERT INTO usage_burn (namespace, bucket_start, gpu_minutes) "
    "SELECT * FROM jsonb_to_recordset(CAST(%(burn)s AS jsonb)) "
    "AS b(namespace text, bucket_start timestamptz, gpu_minutes numeric) ORDER BY 1, 2 "
    "ON CONFLICT (namespace, bucket_start) "
    "DO UPDATE SET gpu_minutes = usage_burn.gpu_minutes + excluded.gpu_minutes"
)

# The same for the per-model burn buckets, after those (db/locks.py).
_ADD_MODEL_BURN = (
    "INSERT INTO usage_model_burn (namespace, model, bucket_start, gpu_minutes) "
    "SELECT * FROM jsonb_to_recordset(CAST(%(burn)s AS jsonb)) "
    "AS b(namespace text, model text, bucket_start timestamptz, gpu_minutes numeric) ORDER BY 1, 2, 3 "
    "ON CONFLICT (namespace, model, bucket_start) "
    "DO UPDATE SET gpu_minutes = usage_model_burn.gpu_minutes + excluded.gpu_minutes"
)


# The namespaces' stored states, locked after the totals and burn buckets (db/locks.py).
@cache
def lock_states(arity: int | None) -> str:
    return pipeline_sql(
        sa.text(
            "SELECT namespace, state, model_states FROM namespace_status "
            f"WHERE namespace = ANY({array_sql('namespace', arity)}) "
            f"ORDER BY {NAMESPACE_ORDER_SQL} FOR UPDATE"
        )
    )


# The history every usage query reads: the per-pod hours ingest writes and the days the roll-up folds
# them into past TIMEKEEPER_HOURLY_HISTORY, as one set of rows that may hold charged time in
# [:since, :until) (the usage_history function, migration 7d3a5c1e9f62; inlined by the planner). Raw ledger
# rows are not read: they may be gone.
HISTORY_FUNCTION = "usage_history"
HISTORY = f"{HISTORY_FUNCTION}(:since, :until)"
# The usage queries' sources: the history's rows, with the names of their keys. A source counts its
# reports once in a bucket (less `continued`, those counted in its previous hour or day, where that is in
# the bucket too: _REPORTS_IN, so a report counts once per bucket, as it does by raw rows); its additive
# figures are sums over its whole charged time, `per` seconds, so the seconds of a bucket or window take
# their part (all of it for a whole hour or day, exactly). (`tab`, `id`), its table and ctid, tell one
# source's pieces apart (within the statement).
_SOURCE_OF = (
    "SELECT h.row_table AS tab, h.row_id AS id, c.namespace, c.pod, c.pod_uid, h.gpu_share, "
    "h.charge_share, m.name AS gpu_model, "
    "h.charged, h.reports, (SELECT sum(extract(epoch FROM upper(q) - lower(q))) FROM unnest(h.charged) AS q) "
    "AS per, h.bucket_start, h.reports_continued AS continued, "
    "h.util_seconds AS util, h.util_covered_seconds AS util_covered, "
    "h.peak_sm_util_pct AS util_peak, "
    "h.mem_byte_seconds AS mem, h.mem_covered_seconds AS mem_covered, h.peak_mem_used_bytes AS mem_peak, "
    "h.energy_joules AS energy, h.gpu_status_bits AS status_bits "
    f"FROM pod_coverage c JOIN {HISTORY} h ON h.pod_key = c.id "
    "LEFT JOIN usage_models m ON m.id = h.model_key WHERE {namespace_of_c}"
)
_USAGE_SOURCE = _SOURCE_OF.format(namespace_of_c="c.namespace = :namespace")
# A namespace key's cluster and bare namespace (timekeeper/domain/clusters.py) in SQL: '' for the local
# cluster, whose keys hold no separator.
_CLUSTER_OF_KEY = "CASE WHEN strpos({key}, '/') = 0 THEN '' ELSE split_part({key}, '/', 1) END"
_NAMESPACE_OF_KEY = "substr({key}, strpos({key}, '/') + 1)"
# The export's sources: _USAGE_SOURCE's over the namespace keys in :namespaces (a text[]; NULL: every
# namespace) of the cluster :cluster (NULL: every cluster; '': the local one).
_EXPORT_SOURCE = _SOURCE_OF.format(
    namespace_of_c="(CAST(:namespaces AS text[]) IS NULL OR c.namespace = ANY(CAST(:namespaces AS text[]))) "
    "AND (CAST(:cluster AS text) IS NULL OR "
    f"{_CLUSTER_OF_KEY.format(key='c.namespace')} = CAST(:cluster AS text))"
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
def _reports_in(lower: str) -> str:
    """A source's reports counted in a bucket whose part inside the window starts at `lower`: those that
    also have charged time in the hour before are counted there, where that hour is inside too."""
    return f"s.reports - CASE WHEN s.bucket_start > {lower} THEN s.continued ELSE 0 END"


def _source_figures(lower: str) -> str:
    """A source's own figures in a bucket (_reports_in's `lower`), one value per source and bucket (max()
    of one value where grouped)."""
    return f"max({_reports_in(lower)}) AS reports, " + _SOURCE_FIGURES


_SOURCE_FIGURES = (
    "max(s.per) AS per, max(s.util) AS util, max(s.util_covered) AS util_covered, "
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
    f"WITH source AS ({_EXPORT_SOURCE}), b AS ("
    "SELECT CAST(:starts AS timestamptz[]) AS starts, CAST(:ends AS timestamptz[]) AS ends), per_source AS ("
    f"SELECT b.starts[k] AS period_start, s.namespace, {_USAGE_PIECE['model'][0]} AS key, "
    f"{_period_sums(_PERIOD)}, "
    f"s.per, {_reports_in('b.starts[k]')} AS reports, "
    "s.util, s.util_covered, s.util_peak, s.mem, s.mem_covered, s.mem_peak, s.energy, "
    f"s.status_bits FROM source s {_SOURCE_WEIGHT} CROSS JOIN b "
    "CROSS JOIN LATERAL generate_series(greatest(width_bucket(lower(s.charged), b.starts), 1), "
    "width_bucket(upper(s.charged) - interval '1 microsecond', b.starts)) AS k "
    f"WHERE s.charged && {_PERIOD} OFFSET 0) "
    f"SELECT period_start, namespace, key, {_TOTALS} FROM per_source GROUP BY period_start, namespace, key "
    f"ORDER BY period_start, {_CLUSTER_OF_KEY.format(key='namespace')}, "
    f"{_NAMESPACE_OF_KEY.format(key='namespace')}, key"
)
_STREAMED_ROWS = 1000  # rows fetched from the server-side cursor at a time

# Per pod over [since, until): allocation (share x charged seconds), the allocation of the seconds that had a
# utilisation figure, and that allocation x the mean SM utilisation, each as share-seconds rounded once to
# GPU-minutes (as the usage answer's minutes are). A source's figures stand for `per` seconds (see above).
_EFFICIENCY = sa.text(
    f"WITH source AS ({_USAGE_SOURCE}), per_source AS ("
    "SELECT s.pod, s.tab, s.id, max(s.gpu_share) AS share, max(s.per) AS per, max(s.util) AS util, "
    "max(s.util_covered) AS util_covered, sum(extract(epoch FROM upper(r) - lower(r))) AS seconds "
    "FROM source s CROSS JOIN LATERAL unnest(s.charged * tstzmultirange(tstzrange(:since, :until))) AS r "
    "GROUP BY 1, 2, 3) "
    "SELECT pod, round(sum(share * seconds) / 60, 9) AS allocated, "
    "round(coalesce(sum(share * util_covered * seconds / per), 0) / 60, 9) AS measured, "
    "round(coalesce(sum(share * util * seconds / per), 0) / 6000, 9) AS utilised "
    "FROM per_source GROUP BY pod ORDER BY pod"
)
# SQLAlchemy leaves its dialects' constructors untyped.
_RUNNING = str(RUNNING_POD.compile(dialect=postgresql.dialect()))  # type: ignore[no-untyped-call]
# Running pods that have held their GPUs since before :held_since (their first charged time) and whose
# utilisation over [:held_since, :now) is known; the caller keeps those below the threshold. From the
# hourly aggregates: an hour the window cuts takes its part of the hour's figures (as usage's windows do).
_HELD = sa.text(
    "WITH pods AS (SELECT id, namespace, pod, pod_uid, lower(covered) AS held_from FROM pod_coverage "
    "WHERE (CAST(:namespaces AS text[]) IS NULL OR namespace = ANY(CAST(:namespaces AS text[]))) "
    f"AND {_RUNNING} AND NOT isempty(covered) AND lower(covered) <= :held_since), pieces AS ("
    "SELECT h.pod_key, h.gpu_share, h.util_seconds AS util, h.util_covered_seconds AS util_covered, "
    "(SELECT sum(extract(epoch FROM upper(q) - lower(q))) FROM unnest(h.charged) AS q) AS per, "
    "extract(epoch FROM upper(r) - lower(r)) AS seconds FROM pods "
    f"JOIN {HISTORY_FUNCTION}(:held_since, :now) h ON h.pod_key = pods.id "
    "CROSS JOIN LATERAL unnest(h.charged * tstzmultirange(tstzrange(:held_since, :now))) AS r) "
    "SELECT pods.namespace, pods.pod, pods.pod_uid, pods.held_from, max(x.gpu_share) AS gpu_share, "
    "round(sum(x.gpu_share * x.seconds) / 60, 9) AS allocated, "
    "sum(x.util * x.seconds / x.per) / sum(x.util_covered * x.seconds / x.per) AS mean_util "
    "FROM pods JOIN pieces x ON x.pod_key = pods.id GROUP BY 1, 2, 3, 4 "
    "HAVING sum(x.util_covered) > 0 ORDER BY 1, 2, 3"
)


def by_period_parameters(
    namespaces: Sequence[str] | None,
    periods: Sequence[tuple[datetime, datetime]],
    cluster: str | None = None,
) -> dict[str, Any]:
    """_USAGE_BY_PERIOD's parameters: the namespace keys (None: all), the cluster (None: all; "": the local
    one) and the periods' bounds, in order."""
    return {
        "namespaces": None if namespaces is None else list(namespaces),
        "cluster": cluster,
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

    @property
    def interval_end(self) -> datetime: ...

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
    model_totals: list[tuple[ModelTotalKey, Decimal]] = field(default_factory=list)  # used, afterwards
    model_states: dict[str, dict[str, str]] = field(default_factory=dict)  # as stored, with `states`


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
        raw_since: datetime | None,
        *,
        from_sidecar: bool,
    ) -> BatchRead:
        """Lock (creating on first sight) the batch's pods and read, in one round trip (two when a pod's model
        is not the one its report names): the namespaces' figures and charge bases, each report's time not yet
        charged, each pod's GPU model and admitted share, the models' weights, and which reports repeat: a
        raw row of the same report, or, past the raw window (`raw_since`; None: no raw rows kept), the
        pod's last seq again with nothing left to charge. The per-report answers fill `records` (`pods`:
        their pod rows as batch_json)."""
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
        last_seq: set[str] = set()
        for pod_uid, lower, upper, model, share, same_seq in await locked.fetchall():
            record = by_uid[pod_uid]
            if record.uncovered is None:
                record.uncovered, record.model, record.admitted = [], model, share
                models.add(model)
                if same_seq:
                    last_seq.add(pod_uid)
            if lower is not None:
                record.uncovered.append((lower, upper))
        for (pod_uid,) in await repeated.fetchall():
            by_uid[pod_uid].repeated = True
        # A retry whose raw row was never kept or is gone: its pod's last seq, all its time charged.
        for pod_uid in last_seq:
            record = by_uid[pod_uid]
            if not record.uncovered and (raw_since is None or record.interval_end <= raw_since):
                record.repeated = True
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
        raw: int,
        models: Sequence[str],
        totals: str | None,
        namespaces: list[str],
        now: datetime,
        raw_since: datetime | None,
        burn: str | None = None,
        mismatched: Sequence[BatchPod] = (),
        model_totals: str | None = None,
        model_burn: str | None = None,
    ) -> BatchWritten:
        """Write a batch's plan in one round trip: hourly aggregates, the `raw` ledger rows that end after
        `raw_since` (None: none), coverage, the `models`' keys, totals, burn buckets, share
        mismatches marked once (the records of `mismatched`, in pod_uid order, whose pods are marked now
        are told so). Answers each total afterwards and the stored states of `namespaces` locked until the
        commit (so the caller writes only states that change)."""
        connection = self.connection
        async with connection.pipeline():  # one Sync, at the exit (as in read)
            if models:
                await connection.execute(_ADD_MODELS, {"models": list(models)})
            inserted = await connection.execute(
                _CHARGE, {"reports": reports, "now": now, "raw_since": raw_since}
            )
            added = None if totals is None else await connection.execute(_ADD_USED, {"totals": totals})
            added_models = (
                None
                if model_totals is None
                else await connection.execute(_ADD_MODEL_USED, {"totals": model_totals})
            )
            if burn is not None:
                await connection.execute(_ADD_BURN, {"burn": burn})
            if model_burn is not None:
                await connection.execute(_ADD_MODEL_BURN, {"burn": model_burn})
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
        if inserted.rowcount != raw:  # a repeat the read did not see: never charge it twice
            raise RuntimeError(f"{raw - inserted.rowcount} ledger rows of the batch were there already")
        if marked is not None:
            by_uid = {record.pod_uid: record for record in mismatched}
            for (pod_uid,) in await marked.fetchall():
                by_uid[pod_uid].mismatch_marked = True
        stored = [] if states is None else await states.fetchall()
        return BatchWritten(
            []
            if added is None
            else [
                ((ns, kind, start), used, granted)
                for ns, kind, start, used, granted in await added.fetchall()
            ],
            {namespace: cast(BudgetState, state) for namespace, state, _ in stored},
            []
            if added_models is None
            else [
                ((ns, kind, start, model), used)
                for ns, kind, start, model, used in await added_models.fetchall()
            ],
            {namespace: models for namespace, _, models in stored},
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
        day or model, with the measurements' sums over the same seconds; from the hourly aggregates."""
        key, piece, bucket = _USAGE_PIECE[group_by]
        lower = (
            "greatest(b, CAST(:since AS timestamptz))"
            if group_by in ("hour", "day")
            else "CAST(:since AS timestamptz)"
        )
        if group_by == "workload":  # rounded per pod, as usage by pod rounds, then summed per workload
            per_pod = f"SELECT key, pod, {_TOTALS} FROM per_source GROUP BY 1, 2"
            rows = f"SELECT key, {_BY_WORKLOAD} FROM ({per_pod}) AS per_pod"
        else:
            rows = f"SELECT key, {_TOTALS} FROM per_source"
        query = sa.text(
            f"WITH source AS ({_USAGE_SOURCE}), per_source AS ("
            f"SELECT {key} AS key, s.pod, s.tab, s.id, {_piece_sums(piece)}, {_source_figures(lower)} "
            f"FROM source s {_SOURCE_WEIGHT} "
            "CROSS JOIN LATERAL unnest(s.charged * tstzmultirange(tstzrange(:since, :until))) AS r "
            f"{bucket} GROUP BY 1, 2, 3, 4) "
            f"{rows} GROUP BY key ORDER BY key"
        )
        result = await self.session.execute(query, {"namespace": namespace, "since": since, "until": until})
        return [usage_found(row) for row in result]

    async def usage_by_period(
        self,
        namespaces: Sequence[str] | None,
        periods: Sequence[tuple[datetime, datetime]],
        cluster: str | None = None,
    ) -> AsyncIterator[tuple[datetime, str, UsageFound]]:
        """usage(namespace, start, end, "model") of every namespace key (None: all) of `cluster` (None:
        every cluster) and period, as one statement streamed from a server-side cursor: (period start,
        namespace key, row), ordered by period, cluster, namespace and model."""
        result = await self.session.stream(
            _USAGE_BY_PERIOD.execution_options(yield_per=_STREAMED_ROWS),
            by_period_parameters(namespaces, periods, cluster),
        )
        async for row in result:
            yield row.period_start, row.namespace, usage_found(row)

    async def efficiency(self, namespace: str, since: datetime, until: datetime) -> list[PodEfficiency]:
        """Per pod over [since, until): allocated, measured and utilised GPU-minutes, exactly (from the hourly
        aggregates)."""
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
