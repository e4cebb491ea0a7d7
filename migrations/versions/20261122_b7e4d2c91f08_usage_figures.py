"""The measured figures reach the usage answers: each ledger row keeps its peak utilisation, the pod's
memory on all its GPUs, its mean power and the GPU statuses seen; the hourly aggregates keep them as sums
that fold exactly (figure x seconds beside the seconds that had it) instead of a per-report mean.

Hourly rows written before keep their utilisation as the mean of their reports, spread over their charged
time (the time weighting they did not record cannot be recovered).

Revision ID: b7e4d2c91f08
Revises: 8d2f6a41c3e9
Create Date: 2026-11-22 21:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "b7e4d2c91f08"
down_revision: str | None = "8d2f6a41c3e9"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CHARGED_SECONDS = (
    "(SELECT coalesce(sum(extract(epoch FROM upper(r) - lower(r))), 0) FROM unnest(charged) AS r)"
)


def upgrade() -> None:
    op.add_column("usage_ledger", sa.Column("peak_sm_util_pct", sa.Numeric(6, 3), nullable=True))
    op.add_column("usage_ledger", sa.Column("mem_used_bytes", sa.BigInteger(), nullable=True))
    op.add_column("usage_ledger", sa.Column("mean_power_w", sa.Numeric(), nullable=True))
    op.add_column(
        "usage_ledger",
        sa.Column("gpu_status_bits", sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
    )
    op.add_column("usage_hourly", sa.Column("util_seconds", sa.Numeric(), nullable=True))
    op.add_column(
        "usage_hourly",
        sa.Column("util_covered_seconds", sa.Numeric(), server_default=sa.text("0"), nullable=False),
    )
    op.add_column("usage_hourly", sa.Column("peak_sm_util_pct", sa.Numeric(6, 3), nullable=True))
    op.add_column("usage_hourly", sa.Column("mem_byte_seconds", sa.Numeric(), nullable=True))
    op.add_column(
        "usage_hourly",
        sa.Column("mem_covered_seconds", sa.Numeric(), server_default=sa.text("0"), nullable=False),
    )
    op.add_column("usage_hourly", sa.Column("peak_mem_used_bytes", sa.BigInteger(), nullable=True))
    op.add_column("usage_hourly", sa.Column("energy_joules", sa.Numeric(), nullable=True))
    op.add_column(
        "usage_hourly",
        sa.Column("gpu_status_bits", sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
    )
    op.execute(
        f"UPDATE usage_hourly SET util_seconds = util_sum / util_count * {_CHARGED_SECONDS}, "
        f"util_covered_seconds = {_CHARGED_SECONDS} WHERE util_count > 0"
    )
    op.drop_column("usage_hourly", "util_sum")
    op.drop_column("usage_hourly", "util_count")


def downgrade() -> None:
    op.add_column("usage_hourly", sa.Column("util_sum", sa.Numeric(), nullable=True))
    op.add_column(
        "usage_hourly", sa.Column("util_count", sa.Integer(), server_default=sa.text("0"), nullable=False)
    )
    op.execute(
        "UPDATE usage_hourly SET util_sum = util_seconds / util_covered_seconds, util_count = 1 "
        "WHERE util_covered_seconds > 0"
    )
    op.alter_column("usage_hourly", "util_count", server_default=None)
    for column in (
        "util_seconds",
        "util_covered_seconds",
        "peak_sm_util_pct",
        "mem_byte_seconds",
        "mem_covered_seconds",
        "peak_mem_used_bytes",
        "energy_joules",
        "gpu_status_bits",
    ):
        op.drop_column("usage_hourly", column)
    for column in ("peak_sm_util_pct", "mem_used_bytes", "mean_power_w", "gpu_status_bits"):
        op.drop_column("usage_ledger", column)
