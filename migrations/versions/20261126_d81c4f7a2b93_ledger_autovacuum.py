"""The raw ledger vacuumed after 2 % of its rows are dead, not 20 %: the roll-up deletes a day of the
seven kept each day, and at the default the ledger carried 46 % more pages on day 30 than on day 7 for
the same live rows (bench/RESULTS.md, History).

Revision ID: d81c4f7a2b93
Revises: a3f9c2d8e4b1
Create Date: 2026-11-26 21:15:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "d81c4f7a2b93"
down_revision: str | None = "a3f9c2d8e4b1"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE usage_ledger SET (autovacuum_vacuum_scale_factor = 0.02, "
        "autovacuum_analyze_scale_factor = 0.01)"
    )


def downgrade() -> None:
    op.execute(
        "ALTER TABLE usage_ledger RESET (autovacuum_vacuum_scale_factor, autovacuum_analyze_scale_factor)"
    )
