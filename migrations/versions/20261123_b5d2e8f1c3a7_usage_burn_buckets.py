"""Per-namespace burn buckets: the GPU-minutes charged in each fixed 5-minute bucket of time, kept by
ingest, so the forecast's burn on every budget read sums a window's buckets (72 rows for six hours)
instead of scanning the namespace's ledger rows in the window (pods x window / 30 s of them). Backfilled
from the ledger's raw rows of the last 7 days, each row's charge attributed to the buckets its charged
time overlaps in proportion to that time (the rule ingest follows, timekeeper/budgets/burn.py).

Revision ID: b5d2e8f1c3a7
Revises: e7b2c9d4a1f6
Create Date: 2026-11-23 01:45:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "b5d2e8f1c3a7"
down_revision: str | None = "e7b2c9d4a1f6"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen here (a migration does not follow later code): 5-minute buckets counted from the Unix epoch.
BACKFILL = """
WITH pieces AS (
    SELECT l.id, l.namespace, l.gpu_minutes, b AS bucket_start,
        extract(epoch FROM upper(c.r * tstzrange(b, b + interval '5 minutes'))
            - lower(c.r * tstzrange(b, b + interval '5 minutes'))) AS seconds
    FROM usage_ledger l
    CROSS JOIN LATERAL unnest(l.charged) AS c(r)
    CROSS JOIN LATERAL generate_series(
        date_bin(interval '5 minutes', lower(c.r), timestamptz '1970-01-01 00:00:00+00'),
        upper(c.r) - interval '1 microsecond', interval '5 minutes') AS b
    WHERE l.interval_end > now() - interval '7 days' AND l.gpu_minutes <> 0
), shares AS (
    SELECT namespace, bucket_start, gpu_minutes, seconds, sum(seconds) OVER (PARTITION BY id) AS total
    FROM pieces
)
INSERT INTO usage_burn (namespace, bucket_start, gpu_minutes)
SELECT namespace, bucket_start, round(sum(gpu_minutes * seconds / total), 9)
FROM shares WHERE total > 0
GROUP BY namespace, bucket_start
"""


def upgrade() -> None:
    op.create_table(
        "usage_burn",
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("bucket_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("gpu_minutes", sa.Numeric(precision=24, scale=9), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "bucket_start", name=op.f("pk_usage_burn")),
    )
    op.execute(BACKFILL)


def downgrade() -> None:
    op.drop_table("usage_burn")
