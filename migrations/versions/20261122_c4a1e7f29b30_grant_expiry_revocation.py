"""Grants can expire inside their period and be revoked: when each happened, who revoked, and when the
grant stopped counting (`ended_at`; the running totals count exactly the grants not ended).

Revision ID: c4a1e7f29b30
Revises: b7e4d2c91f08
Create Date: 2026-11-22 22:45:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c4a1e7f29b30"
down_revision: str | None = "b7e4d2c91f08"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("grants", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("grants", sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("grants", sa.Column("revoked_by", sa.Text(), nullable=True))
    op.add_column("grants", sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True))
    op.create_check_constraint(
        op.f("ck_grants_expires_after_granted"), "grants", "expires_at IS NULL OR expires_at > granted_at"
    )
    op.create_check_constraint(
        op.f("ck_grants_revoked_by_someone"), "grants", "(revoked_at IS NULL) = (revoked_by IS NULL)"
    )
    op.create_check_constraint(
        op.f("ck_grants_revoked_is_ended"), "grants", "revoked_at IS NULL OR ended_at IS NOT NULL"
    )
    op.create_index(
        "ix_grants_expires_at_running",
        "grants",
        ["expires_at"],
        unique=False,
        postgresql_where=sa.text("ended_at IS NULL AND expires_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_grants_expires_at_running",
        table_name="grants",
        postgresql_where=sa.text("ended_at IS NULL AND expires_at IS NOT NULL"),
    )
    op.drop_constraint(op.f("ck_grants_revoked_is_ended"), "grants", type_="check")
    op.drop_constraint(op.f("ck_grants_revoked_by_someone"), "grants", type_="check")
    op.drop_constraint(op.f("ck_grants_expires_after_granted"), "grants", type_="check")
    for column in ("ended_at", "revoked_by", "revoked_at", "expires_at"):
        op.drop_column("grants", column)
