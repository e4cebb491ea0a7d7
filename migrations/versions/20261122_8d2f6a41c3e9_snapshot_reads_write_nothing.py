"""The admission snapshot's read writes nothing: the roll-over is the scheduler's job alone, so the
version row no longer records the day the states were last recomputed for.

Revision ID: 8d2f6a41c3e9
Revises: 3c1d9a7e5b20
Create Date: 2026-11-22 21:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "8d2f6a41c3e9"
down_revision: str | None = "3c1d9a7e5b20"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_column("admission_version", "refreshed_for")


def downgrade() -> None:
    op.add_column(
        "admission_version",
        sa.Column(
            "refreshed_for",
            sa.DateTime(timezone=True),
            server_default=sa.text("'1970-01-01T00:00:00Z'"),
            nullable=False,
        ),
    )
