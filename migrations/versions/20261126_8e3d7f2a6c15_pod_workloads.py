"""Each pod's workload on its coverage row (from the reconcile pass's pod watch), for usage by workload.

Revision ID: 8e3d7f2a6c15
Revises: 6b0e5a1c9d42
Create Date: 2026-11-26 23:45:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "8e3d7f2a6c15"
down_revision: str | None = "6b0e5a1c9d42"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("pod_coverage", sa.Column("workload", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("pod_coverage", "workload")
