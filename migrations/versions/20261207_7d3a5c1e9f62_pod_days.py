"""Pod-days: the pod-hour aggregates older than TIMEKEEPER_HOURLY_HISTORY are folded by the roll-up job into
per pod-day rows (usage_pod_days: the same columns and key, day_start for hour_start), and every reader
reads one history, usage_history(since, until): the hours and the days that may hold charged time in
[since, until).

usage_pod_hours' BRIN on hour_start becomes a btree: the fold deletes old hours and their space is reused
by new ones, so the table's order stops following time (which a BRIN needs); the fold finds its oldest
hour and each hour's rows by it.

Upgrade: nothing is folded here (the roll-up job does it, hour by hour). Downgrade: each day row goes back
into the pod-hours, its charged time split at hour boundaries (every charged second kept); its additive
figures are spread over its hours by seconds, its reports counted in its first hour.

Revision ID: 7d3a5c1e9f62
Revises: e7b3f9a2c1d8
Create Date: 2026-12-07 15:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import TSTZMULTIRANGE

revision: str = "7d3a5c1e9f62"
down_revision: str | None = "e7b3f9a2c1d8"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FIGURES = (
    "util_seconds, util_covered_seconds, peak_sm_util_pct, mem_byte_seconds, mem_covered_seconds, "
    "peak_mem_used_bytes, energy_joules, gpu_status_bits"
)
_HISTORY_COLUMNS = (
    "row_table, row_id, pod_key, bucket_start, gpu_share, charge_share, model_key, charged, reports, "
    "reports_continued, " + _FIGURES
)
# One history over both tables: rows that may hold charged time in [since, until) (until NULL: no end),
# each with its table and ctid (a row's identity across both) and its bucket's start (the hour's or the
# day's). One SELECT, LANGUAGE sql, STABLE, not STRICT: the planner inlines it. The filter stands outside
# the UNION ALL (each bucket's width a constant of its branch), so the union flattens into an append of
# the two tables and a reader's join and filters reach each table's indexes (a branch with its own WHERE
# would stay a subquery scan: no index probe per pod).
_HISTORY = f"""
CREATE FUNCTION usage_history(since timestamptz, until timestamptz)
RETURNS TABLE (row_table oid, row_id tid, pod_key integer, bucket_start timestamptz, gpu_share numeric,
               charge_share numeric, model_key smallint, charged tstzmultirange, reports integer,
               reports_continued smallint, util_seconds numeric, util_covered_seconds numeric,
               peak_sm_util_pct numeric, mem_byte_seconds numeric, mem_covered_seconds numeric,
               peak_mem_used_bytes bigint, energy_joules numeric, gpu_status_bits smallint)
LANGUAGE sql STABLE PARALLEL SAFE AS $$
SELECT {_HISTORY_COLUMNS} FROM (
    SELECT tableoid AS row_table, ctid AS row_id, pod_key, hour_start AS bucket_start,
           interval '1 hour' AS width, gpu_share, charge_share, model_key, charged, reports,
           reports_continued, {_FIGURES}
    FROM usage_pod_hours
    UNION ALL
    SELECT tableoid, ctid, pod_key, day_start, interval '1 day', gpu_share, charge_share, model_key, charged,
           reports, reports_continued, {_FIGURES}
    FROM usage_pod_days
) AS history
WHERE bucket_start > since - width AND bucket_start < coalesce(until, 'infinity')
$$
"""


def upgrade() -> None:
    op.create_table(
        "usage_pod_days",
        sa.Column("pod_key", sa.Integer(), nullable=False),
        sa.Column("day_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("gpu_share", sa.Numeric(), nullable=False),
        sa.Column("charge_share", sa.Numeric(), nullable=False),
        sa.Column("model_key", sa.SmallInteger(), nullable=True),
        sa.Column("charged", TSTZMULTIRANGE(), nullable=False),
        sa.Column("reports", sa.Integer(), nullable=False),
        sa.Column("reports_continued", sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("util_seconds", sa.Numeric(), nullable=True),
        sa.Column("util_covered_seconds", sa.Numeric(), server_default=sa.text("0"), nullable=False),
        sa.Column("peak_sm_util_pct", sa.Numeric(6, 3), nullable=True),
        sa.Column("mem_byte_seconds", sa.Numeric(), nullable=True),
        sa.Column("mem_covered_seconds", sa.Numeric(), server_default=sa.text("0"), nullable=False),
        sa.Column("peak_mem_used_bytes", sa.BigInteger(), nullable=True),
        sa.Column("energy_joules", sa.Numeric(), nullable=True),
        sa.Column("gpu_status_bits", sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
        sa.UniqueConstraint(
            "pod_key",
            "day_start",
            "gpu_share",
            "charge_share",
            "model_key",
            name="uq_usage_pod_days_key",
            postgresql_nulls_not_distinct=True,
        ),
    )
    op.create_index("ix_usage_pod_days_day_start", "usage_pod_days", ["day_start"], postgresql_using="brin")
    # The fold updates a day's row once per hour: room on the page keeps those updates HOT.
    op.execute("ALTER TABLE usage_pod_days SET (fillfactor = 90)")
    op.drop_index("ix_usage_pod_hours_hour_start", "usage_pod_hours")
    op.create_index("ix_usage_pod_hours_hour_start", "usage_pod_hours", ["hour_start"])
    op.execute(_HISTORY)


_COLUMNS = (
    "pod_key, hour_start, gpu_share, charge_share, model_key, charged, reports, reports_continued, "
    + _FIGURES
)
# A day row's hours: its charged time cut at each hour, additive figures by seconds, the reports (and
# those continued from the day before) counted in its first hour.
_UNFOLD = f"""
INSERT INTO usage_pod_hours AS h ({_COLUMNS})
SELECT d.pod_key, b, d.gpu_share, d.charge_share, d.model_key, x.piece,
       CASE WHEN b = first THEN d.reports ELSE 0 END, CASE WHEN b = first THEN d.reports_continued ELSE 0 END,
       d.util_seconds * x.seconds / x.per, d.util_covered_seconds * x.seconds / x.per, d.peak_sm_util_pct,
       d.mem_byte_seconds * x.seconds / x.per, d.mem_covered_seconds * x.seconds / x.per,
       d.peak_mem_used_bytes, d.energy_joules * x.seconds / x.per, d.gpu_status_bits
FROM usage_pod_days d
CROSS JOIN LATERAL (SELECT date_trunc('hour', lower(d.charged), 'UTC') AS first,
       (SELECT sum(extract(epoch FROM upper(q) - lower(q))) FROM unnest(d.charged) AS q) AS per) AS f
CROSS JOIN LATERAL generate_series(f.first, upper(d.charged) - interval '1 microsecond',
                                   interval '1 hour') AS b
CROSS JOIN LATERAL (SELECT p.piece, f.per, (SELECT sum(extract(epoch FROM upper(q) - lower(q)))
       FROM unnest(p.piece) AS q) AS seconds
       FROM (SELECT d.charged * tstzmultirange(tstzrange(b, b + interval '1 hour')) AS piece) AS p) AS x
WHERE NOT isempty(x.piece)
ON CONFLICT ON CONSTRAINT uq_usage_pod_hours_key DO UPDATE SET
    charged = h.charged + excluded.charged, reports = h.reports + excluded.reports,
    reports_continued = h.reports_continued + excluded.reports_continued,
    util_seconds = coalesce(h.util_seconds + excluded.util_seconds, h.util_seconds, excluded.util_seconds),
    util_covered_seconds = h.util_covered_seconds + excluded.util_covered_seconds,
    peak_sm_util_pct = greatest(h.peak_sm_util_pct, excluded.peak_sm_util_pct),
    mem_byte_seconds = coalesce(h.mem_byte_seconds + excluded.mem_byte_seconds, h.mem_byte_seconds,
                                excluded.mem_byte_seconds),
    mem_covered_seconds = h.mem_covered_seconds + excluded.mem_covered_seconds,
    peak_mem_used_bytes = greatest(h.peak_mem_used_bytes, excluded.peak_mem_used_bytes),
    energy_joules = coalesce(h.energy_joules + excluded.energy_joules, h.energy_joules,
                             excluded.energy_joules),
    gpu_status_bits = h.gpu_status_bits | excluded.gpu_status_bits
"""


def downgrade() -> None:
    op.execute("DROP FUNCTION usage_history(timestamptz, timestamptz)")
    op.execute(_UNFOLD)
    op.drop_table("usage_pod_days")
    op.drop_index("ix_usage_pod_hours_hour_start", "usage_pod_hours")
    op.create_index(
        "ix_usage_pod_hours_hour_start", "usage_pod_hours", ["hour_start"], postgresql_using="brin"
    )
