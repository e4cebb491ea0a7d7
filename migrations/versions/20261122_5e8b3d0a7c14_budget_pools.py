"""Budget pools: a budget several namespaces share (listed, or chosen by a label selector over the
namespaces' labels the reconciler records), with optional caps per listed member.

Revision ID: 5e8b3d0a7c14
Revises: c4a19e0d7b3f
Create Date: 2026-11-22 23:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "5e8b3d0a7c14"
down_revision: str | None = "c4a19e0d7b3f"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "budget_pools",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("budget_gpu_minutes", sa.Numeric(24, 9), nullable=False),
        sa.Column("period", sa.Text(), nullable=False),
        sa.Column("warn_at_fraction", sa.Numeric(5, 4), nullable=False),
        sa.Column("namespace_selector", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_by", sa.Text(), nullable=False),
        sa.CheckConstraint("budget_gpu_minutes >= 0", name=op.f("ck_budget_pools_budget_not_negative")),
        sa.CheckConstraint(
            "period IN ('daily', 'weekly', 'monthly', 'none')", name=op.f("ck_budget_pools_period_kind")
        ),
        sa.CheckConstraint(
            "warn_at_fraction > 0 AND warn_at_fraction <= 1", name=op.f("ck_budget_pools_warn_fraction")
        ),
        sa.CheckConstraint(
            "namespace_selector IS NULL OR jsonb_typeof(namespace_selector) = 'object'",
            name=op.f("ck_budget_pools_selector_object"),
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_budget_pools")),
    )
    op.create_table(
        "budget_pool_members",
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("pool", sa.Text(), nullable=False),
        sa.Column("cap_gpu_minutes", sa.Numeric(24, 9), nullable=True),
        sa.CheckConstraint(
            "cap_gpu_minutes IS NULL OR cap_gpu_minutes >= 0",
            name=op.f("ck_budget_pool_members_cap_not_negative"),
        ),
        sa.ForeignKeyConstraint(
            ["pool"],
            ["budget_pools.name"],
            name=op.f("fk_budget_pool_members_pool_budget_pools"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("namespace", name=op.f("pk_budget_pool_members")),
    )
    op.create_index("ix_budget_pool_members_pool", "budget_pool_members", ["pool"], unique=False)
    op.create_table(
        "namespace_labels",
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("labels", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("namespace", name=op.f("pk_namespace_labels")),
    )
    op.create_index(
        "ix_namespace_labels_labels", "namespace_labels", ["labels"], unique=False, postgresql_using="gin"
    )


def downgrade() -> None:
    op.drop_index("ix_namespace_labels_labels", table_name="namespace_labels", postgresql_using="gin")
    op.drop_table("namespace_labels")
    op.drop_index("ix_budget_pool_members_pool", table_name="budget_pool_members")
    op.drop_table("budget_pool_members")
    op.drop_table("budget_pools")
