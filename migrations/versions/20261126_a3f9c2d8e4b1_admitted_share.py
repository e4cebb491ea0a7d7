"""Each pod's admitted GPU share on its coverage row (what its time is charged at, whatever a report
states), and when a report first stated another.

Revision ID: a3f9c2d8e4b1
Revises: b5d2e8f1c3a7
Create Date: 2026-11-26 20:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "a3f9c2d8e4b1"
down_revision: str | None = "b5d2e8f1c3a7"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("pod_coverage", sa.Column("admitted_share", sa.Numeric(), nullable=True))
    op.add_column("pod_coverage", sa.Column("share_mismatch_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("pod_coverage", "share_mismatch_at")
    op.drop_column("pod_coverage", "admitted_share")
