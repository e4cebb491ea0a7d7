"""Billing: weights per GPU model with their history, prices per GPU-hour, the charge basis; each ledger
row and hourly aggregate records its charge rate and GPU model; `gpu_weighted_seconds`, the one SQL
spelling of "a weight applies from its time on" (timekeeper/domain/weights.py is the Python one).

Revision ID: c4a81e6f9d27
Revises: 5e8b3d0a7c14
Create Date: 2026-11-22 23:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c4a81e6f9d27"
down_revision: str | None = "5e8b3d0a7c14"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A range's seconds, each second counted at the weight its model had then (1 where none was set).
WEIGHTED_SECONDS = """
CREATE FUNCTION gpu_weighted_seconds(gpu_model text, piece tstzrange) RETURNS numeric
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT extract(epoch FROM upper(piece) - lower(piece)) + coalesce((
        SELECT sum((w.weight - 1) * extract(epoch FROM upper(piece * w.valid) - lower(piece * w.valid)))
        FROM (
            SELECT weight, tstzrange(effective_from, lead(effective_from) OVER (ORDER BY effective_from))
                AS valid
            FROM gpu_weights WHERE model = gpu_model
        ) AS w
        WHERE w.valid && piece
    ), 0)
$$
"""


def upgrade() -> None:
    op.create_table(
        "gpu_weights",
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("effective_from", sa.DateTime(timezone=True), nullable=False),
        sa.Column("weight", sa.Numeric(12, 6), nullable=False),
        sa.Column("set_by", sa.Text(), nullable=False),
        sa.CheckConstraint("weight > 0", name=op.f("ck_gpu_weights_positive")),
        sa.PrimaryKeyConstraint("model", "effective_from", name=op.f("pk_gpu_weights")),
    )
    op.create_table(
        "gpu_prices",
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("price_per_gpu_hour", sa.Numeric(18, 6), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("updated_by", sa.Text(), nullable=False),
        sa.CheckConstraint("price_per_gpu_hour >= 0", name=op.f("ck_gpu_prices_not_negative")),
        sa.PrimaryKeyConstraint("model", name=op.f("pk_gpu_prices")),
    )
    op.create_table(
        "charge_basis",
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("basis", sa.Text(), nullable=False),
        sa.Column("floor", sa.Numeric(3, 2), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("updated_by", sa.Text(), nullable=False),
        sa.CheckConstraint("basis IN ('allocation', 'measured')", name=op.f("ck_charge_basis_basis_kind")),
        sa.CheckConstraint("floor >= 0 AND floor <= 1", name=op.f("ck_charge_basis_floor_fraction")),
        sa.PrimaryKeyConstraint("scope", name=op.f("pk_charge_basis")),
    )
    for table in ("usage_ledger", "usage_hourly"):
        op.add_column(table, sa.Column("charge_share", sa.Numeric(), nullable=True))
        op.add_column(table, sa.Column("gpu_model", sa.Text(), nullable=True))
        op.execute(f"UPDATE {table} SET charge_share = gpu_share")
        op.alter_column(table, "charge_share", nullable=False)
    op.add_column("pod_coverage", sa.Column("gpu_model", sa.Text(), nullable=True))
    op.drop_constraint("uq_usage_hourly_pod_hour_share", "usage_hourly", type_="unique")
    op.create_unique_constraint(
        "uq_usage_hourly_pod_hour_share",
        "usage_hourly",
        ["pod_uid", "hour_start", "gpu_share", "charge_share", "gpu_model"],
        postgresql_nulls_not_distinct=True,
    )
    op.execute(WEIGHTED_SECONDS)


def downgrade() -> None:
    op.execute("DROP FUNCTION gpu_weighted_seconds(text, tstzrange)")
    op.drop_constraint("uq_usage_hourly_pod_hour_share", "usage_hourly", type_="unique")
    op.create_unique_constraint(
        "uq_usage_hourly_pod_hour_share", "usage_hourly", ["pod_uid", "hour_start", "gpu_share"]
    )
    op.drop_column("pod_coverage", "gpu_model")
    for table in ("usage_hourly", "usage_ledger"):
        op.drop_column(table, "gpu_model")
        op.drop_column(table, "charge_share")
    op.drop_table("charge_basis")
    op.drop_table("gpu_prices")
    op.drop_table("gpu_weights")
