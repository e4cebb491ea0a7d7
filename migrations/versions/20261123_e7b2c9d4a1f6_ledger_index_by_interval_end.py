"""The ledger's per-namespace index ordered by interval end, not start: every recent-window read (the
forecast's burn on each budget read, usage of the current period) asks for rows ending after a moment, so
the index now stops at the window's start instead of walking the namespace's whole retained history.

Revision ID: e7b2c9d4a1f6
Revises: c4a81e6f9d27
Create Date: 2026-11-23 00:25:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "e7b2c9d4a1f6"
down_revision: str | None = "c4a81e6f9d27"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_usage_ledger_namespace_interval_start", table_name="usage_ledger")
    op.create_index("ix_usage_ledger_namespace_interval_end", "usage_ledger", ["namespace", "interval_end"])


def downgrade() -> None:
    op.drop_index("ix_usage_ledger_namespace_interval_end", table_name="usage_ledger")
    op.create_index(
        "ix_usage_ledger_namespace_interval_start", "usage_ledger", ["namespace", "interval_start"]
    )
