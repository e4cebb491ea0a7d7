"""The ledger's per-GPU entries kept positionally: each GPU as its values in the report's field order
(timekeeper/usage/schemas.py GPU_FIELDS), trailing nulls left out, not as an object repeating 13 keys on
every row (336 of a 539-byte row; bench/ledger_bytes.py). Plain UPDATEs: they run on a partitioned ledger
as on a table. Every row holding GPU entries is rewritten once (the ledger doubles until vacuumed).

Revision ID: cb6919911663
Revises: 8e3d7f2a6c15
Create Date: 2026-11-27 02:00:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "cb6919911663"
down_revision: str | None = "8e3d7f2a6c15"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# GpuFiguresIn's fields as of this revision, in order (later fields are appended to the model).
FIELDS = (
    "uuid",
    "sm_util_pct",
    "mem_used_bytes",
    "mem_total_bytes",
    "sm_util_max_pct",
    "energy_joules",
    "status",
    "name",
    "parent_uuid",
    "pod_sm_util_pct",
    "pod_sm_util_max_pct",
    "pod_mem_used_bytes",
    "pod_processes",
)
_VALUES = ", ".join(f"g.e -> '{field}'" for field in FIELDS)
# Each object as the array of its values, cut after the last one not null (an absent key and a JSON null
# are the same: None).
_UPGRADE = f"""
UPDATE usage_ledger l SET gpus = (
    SELECT coalesce(jsonb_agg(to_jsonb(v.a[1:(
        SELECT coalesce(max(u.k), 0) FROM unnest(v.a) WITH ORDINALITY AS u(x, k)
        WHERE x IS NOT NULL AND x <> 'null'::jsonb)]) ORDER BY g.i), '[]'::jsonb)
    FROM jsonb_array_elements(l.gpus) WITH ORDINALITY AS g(e, i)
    CROSS JOIN LATERAL (SELECT ARRAY[{_VALUES}] AS a) AS v)
WHERE jsonb_typeof(l.gpus -> 0) = 'object'
"""
_PAIRS = ", ".join(f"'{field}', g.e -> {index}" for index, field in enumerate(FIELDS))
# Each array back as the object ingest wrote before (every field named, null where not sent).
_DOWNGRADE = f"""
UPDATE usage_ledger l SET gpus = (
    SELECT jsonb_agg(jsonb_build_object({_PAIRS}) ORDER BY g.i)
    FROM jsonb_array_elements(l.gpus) WITH ORDINALITY AS g(e, i))
WHERE jsonb_typeof(l.gpus -> 0) = 'array'
"""


def upgrade() -> None:
    op.execute(_UPGRADE)


def downgrade() -> None:
    op.execute(_DOWNGRADE)
