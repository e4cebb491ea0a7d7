"""`running_pod_action` may also say `kueue`: lower an exhausted namespace's Kueue Workloads' priority
(docs/kubernetes.md, "Kueue Workloads"); the check constraint of both budget tables widened.

Revision ID: 6b0e5a1c9d42
Revises: d81c4f7a2b93
Create Date: 2026-11-26 23:30:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "6b0e5a1c9d42"
down_revision: str | None = "d81c4f7a2b93"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("namespace_budgets", "default_budget")
ACTIONS = "running_pod_action IN ('none', 'evict', 'kueue')"
BEFORE = "running_pod_action IN ('none', 'evict')"


def upgrade() -> None:
    for table in TABLES:
        op.drop_constraint(op.f(f"ck_{table}_running_pod_action"), table, type_="check")
        op.create_check_constraint(op.f(f"ck_{table}_running_pod_action"), table, ACTIONS)


def downgrade() -> None:
    # A budget that says `kueue` cannot be kept by the older schema: it goes back to what it inherits
    # (a namespace) or to the shipped `none` (the default).
    op.execute("UPDATE namespace_budgets SET running_pod_action = NULL WHERE running_pod_action = 'kueue'")
    op.execute("UPDATE default_budget SET running_pod_action = 'none' WHERE running_pod_action = 'kueue'")
    for table in TABLES:
        op.drop_constraint(op.f(f"ck_{table}_running_pod_action"), table, type_="check")
        op.create_check_constraint(op.f(f"ck_{table}_running_pod_action"), table, BEFORE)
