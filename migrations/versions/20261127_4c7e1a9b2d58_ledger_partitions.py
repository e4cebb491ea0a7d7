"""The raw ledger partitioned by UTC day of interval_end, so the roll-up drops a day instead of deleting its
rows. The existing table is not rewritten: renamed, its key widened to (id, interval_end) (an index build),
and attached as the partition of everything before tomorrow or its latest row's next day (two reads of it);
the roll-up empties it by DELETE over the retention and then drops it. Self-contained on purpose.

Revision ID: 4c7e1a9b2d58
Revises: 8e3d7f2a6c15
Create Date: 2026-11-27 02:10:00.000000
"""

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import op

revision: str = "4c7e1a9b2d58"
down_revision: str | None = "8e3d7f2a6c15"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Day partitions from the bound on; the app's upkeep (start-up, the leader's job) keeps creating them.
DAYS_AHEAD = 3


def upgrade() -> None:
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    op.execute("ALTER TABLE usage_ledger RENAME TO usage_ledger_before")
    op.execute(
        "ALTER TABLE usage_ledger_before RENAME CONSTRAINT uq_usage_ledger_report "
        "TO uq_usage_ledger_before_report"
    )
    op.execute(
        "ALTER INDEX ix_usage_ledger_namespace_interval_end "
        "RENAME TO ix_usage_ledger_before_namespace_interval_end"
    )
    op.execute("ALTER INDEX ix_usage_ledger_interval_end RENAME TO ix_usage_ledger_before_interval_end")
    op.execute("ALTER TABLE usage_ledger_before DROP CONSTRAINT pk_usage_ledger")
    op.execute(
        "ALTER TABLE usage_ledger_before ADD CONSTRAINT pk_usage_ledger_before PRIMARY KEY (id, interval_end)"
    )
    op.execute(
        "CREATE TABLE usage_ledger (LIKE usage_ledger_before INCLUDING DEFAULTS) "
        "PARTITION BY RANGE (interval_end)"
    )
    op.execute("ALTER SEQUENCE usage_ledger_id_seq OWNED BY usage_ledger.id")
    op.execute("ALTER TABLE usage_ledger ADD CONSTRAINT pk_usage_ledger PRIMARY KEY (id, interval_end)")
    op.execute(
        "ALTER TABLE usage_ledger ADD CONSTRAINT uq_usage_ledger_report "
        "UNIQUE (pod_uid, seq, interval_start, interval_end)"
    )
    op.execute(
        "CREATE INDEX ix_usage_ledger_namespace_interval_end ON usage_ledger (namespace, interval_end)"
    )
    op.execute("CREATE INDEX ix_usage_ledger_interval_end ON usage_ledger USING brin (interval_end)")
    # Everything up to the day after the latest row (at least tomorrow): ATTACH proves it in one scan.
    bound = (
        op.get_bind()
        .execute(
            sa.text(
                "SELECT greatest(CAST(:tomorrow AS timestamptz), "
                "date_trunc('day', max(interval_end), 'UTC') + interval '1 day') FROM usage_ledger_before"
            ),
            {"tomorrow": today + timedelta(days=1)},
        )
        .scalar_one()
        .astimezone(UTC)
    )
    op.execute(
        f"ALTER TABLE usage_ledger ATTACH PARTITION usage_ledger_before "
        f"FOR VALUES FROM (MINVALUE) TO ('{bound.isoformat()}')"
    )
    # Emptied by DELETE, like the table before: vacuumed after 2 % of its rows are dead (d81c4f7a2b93).
    op.execute(
        "CREATE TABLE usage_ledger_default PARTITION OF usage_ledger DEFAULT "
        "WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.01)"
    )
    for n in range(DAYS_AHEAD):
        start = bound + timedelta(days=n)
        op.execute(
            f"CREATE TABLE usage_ledger_p{start:%Y%m%d} PARTITION OF usage_ledger "
            f"FOR VALUES FROM ('{start.isoformat()}') TO ('{(start + timedelta(days=1)).isoformat()}')"
        )


def downgrade() -> None:
    """Copies the rows into one plain table again (fine for a small ledger; a large one wants a dump)."""
    op.execute("CREATE TABLE usage_ledger_flat (LIKE usage_ledger INCLUDING DEFAULTS)")
    op.execute("INSERT INTO usage_ledger_flat SELECT * FROM usage_ledger")
    op.execute("ALTER SEQUENCE usage_ledger_id_seq OWNED BY usage_ledger_flat.id")
    op.execute("DROP TABLE usage_ledger")
    op.execute("ALTER TABLE usage_ledger_flat RENAME TO usage_ledger")
    op.execute("ALTER TABLE usage_ledger ADD CONSTRAINT pk_usage_ledger PRIMARY KEY (id)")
    op.execute(
        "ALTER TABLE usage_ledger ADD CONSTRAINT uq_usage_ledger_report "
        "UNIQUE (pod_uid, seq, interval_start, interval_end)"
    )
    op.execute(
        "CREATE INDEX ix_usage_ledger_namespace_interval_end ON usage_ledger (namespace, interval_end)"
    )
    op.execute("CREATE INDEX ix_usage_ledger_interval_end ON usage_ledger USING brin (interval_end)")
    op.execute(
        "ALTER TABLE usage_ledger SET (autovacuum_vacuum_scale_factor = 0.02, "
        "autovacuum_analyze_scale_factor = 0.01)"
    )
