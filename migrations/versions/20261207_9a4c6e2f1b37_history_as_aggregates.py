"""History as aggregates: per pod-hour rows written by ingest (usage_pod_hours), keyed by small integers
(pod_coverage.id, usage_models.id) rather than repeated text; raw ledger rows are kept only briefly.

Upgrade: pod_coverage gains its key; every usage_hourly row moves to usage_pod_hours as it is, and every raw
ledger row is folded in, one hour of interval_end per statement (so no statement grows with the ledger),
exactly as the roll-up folded them; usage_hourly is dropped. The raw rows stay (the periodic job deletes
those past TIMEKEEPER_LEDGER_RETENTION). A ledger or hourly row whose pod has no pod_coverage row (none
should) gets one, so every charged minute moves.

Downgrade: the aggregates go back to usage_hourly (names again for keys), and the raw ledger rows are
deleted: their charge is in those aggregates already, and the older code reads both, so keeping them would
count them twice. Raw rows (audit, per-report figures) are therefore lost on downgrade; no charge is.

Revision ID: 9a4c6e2f1b37
Revises: cb6919911663
Create Date: 2026-12-07 05:40:00.000000
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import TSTZMULTIRANGE

revision: str = "9a4c6e2f1b37"
down_revision: str | None = "cb6919911663"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_MISSING_PODS = """
INSERT INTO pod_coverage (pod_uid, namespace, pod, covered, last_seq, last_report_at, final)
SELECT pod_uid, max(namespace), max(pod), range_agg(r), 0, max(upper(r)), false
FROM (SELECT pod_uid, namespace, pod, charged FROM usage_hourly
      UNION ALL SELECT pod_uid, namespace, pod, charged FROM usage_ledger) AS s
CROSS JOIN LATERAL unnest(s.charged) AS r
WHERE NOT EXISTS (SELECT FROM pod_coverage c WHERE c.pod_uid = s.pod_uid)
GROUP BY pod_uid
"""
_MODELS = """
INSERT INTO usage_models (name)
SELECT DISTINCT gpu_model FROM (SELECT gpu_model FROM usage_hourly UNION SELECT gpu_model FROM usage_ledger) m
WHERE gpu_model IS NOT NULL ORDER BY 1
"""
_FIGURES = (
    "util_seconds, util_covered_seconds, peak_sm_util_pct, mem_byte_seconds, mem_covered_seconds, "
    "peak_mem_used_bytes, energy_joules, gpu_status_bits"
)
_COLUMNS = (
    "pod_key, hour_start, gpu_share, charge_share, model_key, charged, reports, reports_continued, "
    + _FIGURES
)
_MOVE_HOURLY = f"""
INSERT INTO usage_pod_hours ({_COLUMNS})
SELECT c.id, h.hour_start, h.gpu_share, h.charge_share, m.id, h.charged, h.reports, 0, {_FIGURES}
FROM usage_hourly h JOIN pod_coverage c ON c.pod_uid = h.pod_uid
LEFT JOIN usage_models m ON m.name = h.gpu_model
"""
# The roll-up's fold (a report counts once in each hour its charge touches; its figures as figure x its
# seconds there), of the ledger rows whose interval_end lies in one hour, its end included (a report
# ending on the hour is folded with the rest of that hour's, so an aggregate is written once, not
# updated by the next hour's statement).
_FOLD_HOUR = f"""
WITH pieces AS (
    SELECT l.id, l.pod_uid, l.gpu_share, l.charge_share, l.gpu_model, b AS hour_start,
           r * tstzrange(b, b + interval '1 hour') AS piece, l.mean_sm_util_pct AS util,
           b > date_trunc('hour', lower(l.charged), 'UTC') AS continued,
           coalesce(l.peak_sm_util_pct, l.mean_sm_util_pct) AS util_peak, l.mem_used_bytes AS mem,
           l.mean_power_w AS power, l.gpu_status_bits AS status_bits
    FROM usage_ledger l
    CROSS JOIN LATERAL unnest(l.charged) AS r
    CROSS JOIN LATERAL generate_series(
        date_trunc('hour', lower(r), 'UTC'), upper(r) - interval '1 microsecond', interval '1 hour') AS b
    WHERE l.interval_end > :hour AND l.interval_end <= CAST(:hour AS timestamptz) + interval '1 hour'
), per_report AS (
    SELECT id, pod_uid, hour_start, gpu_share, charge_share, gpu_model, range_agg(piece) AS charged,
           sum(extract(epoch FROM upper(piece) - lower(piece))) AS seconds, max(util) AS util,
           max(util_peak) AS util_peak, max(mem) AS mem, max(power) AS power, max(status_bits) AS status_bits,
           bool_or(continued) AS continued
    FROM pieces GROUP BY id, pod_uid, hour_start, gpu_share, charge_share, gpu_model
)
INSERT INTO usage_pod_hours AS h ({_COLUMNS})
SELECT c.id, p.hour_start, p.gpu_share, p.charge_share, m.id, range_agg(p.charged), count(*),
       count(*) FILTER (WHERE p.continued),
       sum(p.util * p.seconds), coalesce(sum(p.seconds) FILTER (WHERE p.util IS NOT NULL), 0),
       max(p.util_peak), sum(p.mem * p.seconds), coalesce(sum(p.seconds) FILTER (WHERE p.mem IS NOT NULL), 0),
       max(p.mem), sum(p.power * p.seconds), bit_or(p.status_bits)
FROM per_report p JOIN pod_coverage c ON c.pod_uid = p.pod_uid
LEFT JOIN usage_models m ON m.name = p.gpu_model
GROUP BY c.id, p.hour_start, p.gpu_share, p.charge_share, m.id
ON CONFLICT ON CONSTRAINT uq_usage_pod_hours_key DO UPDATE SET
    charged = h.charged + excluded.charged,
    reports = h.reports + excluded.reports,
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
_LEDGER_HOURS = (
    "SELECT DISTINCT date_trunc('hour', interval_end - interval '1 microsecond', 'UTC') AS hour "
    "FROM usage_ledger "
    "WHERE NOT isempty(charged) ORDER BY 1"
)


def _figure_columns() -> list[sa.Column[Any]]:
    return [
        sa.Column("util_seconds", sa.Numeric(), nullable=True),
        sa.Column("util_covered_seconds", sa.Numeric(), server_default=sa.text("0"), nullable=False),
        sa.Column("peak_sm_util_pct", sa.Numeric(6, 3), nullable=True),
        sa.Column("mem_byte_seconds", sa.Numeric(), nullable=True),
        sa.Column("mem_covered_seconds", sa.Numeric(), server_default=sa.text("0"), nullable=False),
        sa.Column("peak_mem_used_bytes", sa.BigInteger(), nullable=True),
        sa.Column("energy_joules", sa.Numeric(), nullable=True),
        sa.Column("gpu_status_bits", sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
    ]


def upgrade() -> None:
    # As the timekeeper's own sessions (db/session.py): the fold's estimates pass jit_above_cost, and
    # compiling it would cost each hour's statement far more than running it.
    op.execute("SET LOCAL jit = off")
    op.execute(_MISSING_PODS)
    op.add_column("pod_coverage", sa.Column("id", sa.Integer(), sa.Identity(), nullable=False))
    op.create_unique_constraint("uq_pod_coverage_id", "pod_coverage", ["id"])
    op.create_table(
        "usage_models",
        sa.Column("id", sa.SmallInteger(), sa.Identity(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_usage_models"),
        sa.UniqueConstraint("name", name="uq_usage_models_name"),
    )
    op.create_table(
        "usage_pod_hours",
        sa.Column("pod_key", sa.Integer(), nullable=False),
        sa.Column("hour_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("gpu_share", sa.Numeric(), nullable=False),
        sa.Column("charge_share", sa.Numeric(), nullable=False),
        sa.Column("model_key", sa.SmallInteger(), nullable=True),
        sa.Column("charged", TSTZMULTIRANGE(), nullable=False),
        sa.Column("reports", sa.Integer(), nullable=False),
        sa.Column("reports_continued", sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
        *_figure_columns(),
        sa.UniqueConstraint(
            "pod_key",
            "hour_start",
            "gpu_share",
            "charge_share",
            "model_key",
            name="uq_usage_pod_hours_key",
            postgresql_nulls_not_distinct=True,
        ),
    )
    op.create_index(
        "ix_usage_pod_hours_hour_start", "usage_pod_hours", ["hour_start"], postgresql_using="brin"
    )
    # Every report updates its pod's row of the hour: room on the page keeps those updates HOT.
    op.execute("ALTER TABLE usage_pod_hours SET (fillfactor = 90)")
    op.execute(_MODELS)
    op.execute(_MOVE_HOURLY)
    bind = op.get_bind()
    for (hour,) in bind.execute(sa.text(_LEDGER_HOURS)).all():
        bind.execute(sa.text(_FOLD_HOUR), {"hour": hour})
    op.drop_table("usage_hourly")


_RESTORE_HOURLY = f"""
INSERT INTO usage_hourly (namespace, pod, pod_uid, hour_start, gpu_share, charge_share, gpu_model, charged,
                          reports, {_FIGURES})
SELECT c.namespace, c.pod, c.pod_uid, h.hour_start, h.gpu_share, h.charge_share, m.name, h.charged, h.reports,
       {", ".join("h." + column for column in _FIGURES.split(", "))}
FROM usage_pod_hours h JOIN pod_coverage c ON c.id = h.pod_key LEFT JOIN usage_models m ON m.id = h.model_key
"""


def downgrade() -> None:
    op.create_table(
        "usage_hourly",
        sa.Column("id", sa.BigInteger(), autoincrement=True, nullable=False),
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("pod", sa.Text(), nullable=False),
        sa.Column("pod_uid", sa.Text(), nullable=False),
        sa.Column("hour_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("gpu_share", sa.Numeric(), nullable=False),
        sa.Column("charged", TSTZMULTIRANGE(), nullable=False),
        sa.Column("reports", sa.Integer(), nullable=False),
        *_figure_columns(),
        sa.Column("charge_share", sa.Numeric(), nullable=False),
        sa.Column("gpu_model", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_usage_hourly"),
        sa.UniqueConstraint(
            "pod_uid",
            "hour_start",
            "gpu_share",
            "charge_share",
            "gpu_model",
            name="uq_usage_hourly_pod_hour_share",
            postgresql_nulls_not_distinct=True,
        ),
    )
    op.create_index("ix_usage_hourly_namespace_hour_start", "usage_hourly", ["namespace", "hour_start"])
    op.execute(_RESTORE_HOURLY)
    # Their charge is in usage_hourly now; the older code would count them again.
    op.execute("DELETE FROM usage_ledger")
    op.drop_table("usage_pod_hours")
    op.drop_table("usage_models")
    op.drop_constraint("uq_pod_coverage_id", "pod_coverage", type_="unique")
    op.drop_column("pod_coverage", "id")
