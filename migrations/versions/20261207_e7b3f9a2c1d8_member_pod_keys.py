"""A member's pods under their pod keys (docs/fleet.md, `pod_key`): the charged time of a member cluster's
pod is kept under `<cluster>/<uid>`, since a uid is unique in its own cluster only. A hub that served
members before kept theirs under the bare uid; without this, the member's reconcile pass would find no
coverage under the key and charge each running pod's whole life again. A row is a member's where its
namespace is a key (`<cluster>/<namespace>`); the hub's own rows are not touched.

Revision ID: e7b3f9a2c1d8
Revises: c4d1a7e9f203
Create Date: 2026-12-07 15:40:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "e7b3f9a2c1d8"
down_revision: str | None = "c4d1a7e9f203"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("pod_coverage", "usage_ledger")


def upgrade() -> None:
    for table in TABLES:
        op.execute(
            f"UPDATE {table} SET pod_uid = split_part(namespace, '/', 1) || '/' || pod_uid "
            "WHERE strpos(namespace, '/') > 0 AND strpos(pod_uid, '/') = 0"
        )


def downgrade() -> None:
    for table in TABLES:
        op.execute(
            f"UPDATE {table} SET pod_uid = split_part(pod_uid, '/', 2) "
            "WHERE strpos(namespace, '/') > 0 AND strpos(pod_uid, '/') > 0"
        )
