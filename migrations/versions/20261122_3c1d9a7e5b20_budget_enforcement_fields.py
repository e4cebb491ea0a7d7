"""Budgets carry the priority policy and the running-pod action: per namespace (NULL = follow the
default) and on the default (the shipped policy, no action on running pods)

Revision ID: 3c1d9a7e5b20
Revises: 655619bbcd4c
Create Date: 2026-11-22 19:50:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "3c1d9a7e5b20"
down_revision: str | None = "655619bbcd4c"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The shipped default (gpuaccounting.admission_state.default_priority_policy) as of this revision.
SHIPPED_POLICY = (
    '\'{"exempt_classes": ["system-cluster-critical", "system-node-critical"], '
    '"user_classes": "keep_up_to_ceiling", "ceiling": null}\'::jsonb'
)
ACTIONS = "running_pod_action IN ('none', 'evict')"
POLICY_IS_OBJECT = "jsonb_typeof(priority_policy) = 'object'"


def upgrade() -> None:
    op.add_column("namespace_budgets", sa.Column("priority_policy", postgresql.JSONB(), nullable=True))
    op.add_column("namespace_budgets", sa.Column("running_pod_action", sa.Text(), nullable=True))
    op.add_column(
        "default_budget",
        sa.Column(
            "priority_policy", postgresql.JSONB(), server_default=sa.text(SHIPPED_POLICY), nullable=False
        ),
    )
    op.add_column(
        "default_budget", sa.Column("running_pod_action", sa.Text(), server_default="none", nullable=False)
    )
    for table in ("namespace_budgets", "default_budget"):
        op.create_check_constraint(op.f(f"ck_{table}_running_pod_action"), table, ACTIONS)
        op.create_check_constraint(op.f(f"ck_{table}_priority_policy_object"), table, POLICY_IS_OBJECT)


def downgrade() -> None:
    for table in ("namespace_budgets", "default_budget"):
        op.drop_constraint(op.f(f"ck_{table}_priority_policy_object"), table, type_="check")
        op.drop_constraint(op.f(f"ck_{table}_running_pod_action"), table, type_="check")
        op.drop_column(table, "running_pod_action")
        op.drop_column(table, "priority_policy")
