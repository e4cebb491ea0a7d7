"""Which budgets a Kubernetes object (GPUBudget, GPUBudgetDefault) governs: the REST API refuses to change
them (docs/gitops.md).

Revision ID: c4a19e0d7b3f
Revises: c4a1e7f29b30
Create Date: 2026-11-22 23:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c4a19e0d7b3f"
down_revision: str | None = "c4a1e7f29b30"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gitops_budgets",
        sa.Column("key", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("uid", sa.Text(), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_gitops_budgets")),
    )


def downgrade() -> None:
    op.drop_table("gitops_budgets")
