"""Actors carry their cluster (docs/fleet.md): the audit log's `actor_cluster` and a pool's
`updated_by_cluster` name the member cluster whose API server authenticated the actor, so `alice` of the hub
and `alice` of member `b` are told apart. NULL is the hub's own cluster, which every row written before a
fleet was (rows written since fleets began and before this revision are NULL too: their cluster is not
known). A namespace's budget, grants and charge basis need no such column: only principals of the
namespace's own cluster change them, so their key names it.

Revision ID: c4d1a7e9f203
Revises: 5b8e2d1c7a40
Create Date: 2026-12-07 14:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "c4d1a7e9f203"
down_revision: str | None = "5b8e2d1c7a40"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("audit_log", sa.Column("actor_cluster", sa.Text(), nullable=True))
    op.add_column("budget_pools", sa.Column("updated_by_cluster", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("budget_pools", "updated_by_cluster")
    op.drop_column("audit_log", "actor_cluster")
