"""A slimmer ledger row: the per-GPU entries kept positionally, each GPU as its values in the report's
field order (timekeeper/usage/schemas.py GPU_FIELDS), trailing nulls left out, not as an object repeating
13 keys on every row (336 of a 539-byte row; bench/ledger_bytes.py); `gpu_count` and `max_mem_used_bytes`,
which no answer reads and `gpus` holds, dropped. Plain ALTER TABLE and UPDATE: they run on a partitioned
ledger as on a table. Every row holding GPU entries is rewritten once (the ledger doubles until vacuumed).

Revision ID: cb6919911663
Revises: 4c7e1a9b2d58
Create Date: 2026-11-27 02:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "cb6919911663"
down_revision: str | None = "4c7e1a9b2d58"
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


# The dropped figures again, as measure() computed them: the GPUs, the most any one held (the pod's own
# memory on it where sent, else the device's).
_POD_MEMORY, _MEMORY = FIELDS.index("pod_mem_used_bytes"), FIELDS.index("mem_used_bytes")
_FIGURES = f"""
UPDATE usage_ledger l SET gpu_count = jsonb_array_length(l.gpus), max_mem_used_bytes = (
    SELECT max(CAST(coalesce(g.e ->> {_POD_MEMORY}, g.e ->> {_MEMORY}) AS bigint))
    FROM jsonb_array_elements(l.gpus) AS g(e))
"""


def upgrade() -> None:
    op.drop_column("usage_ledger", "gpu_count")
    op.drop_column("usage_ledger", "max_mem_used_bytes")
    op.execute(_UPGRADE)


def downgrade() -> None:
    op.add_column("usage_ledger", sa.Column("gpu_count", sa.Integer(), nullable=True))
    op.add_column("usage_ledger", sa.Column("max_mem_used_bytes", sa.BigInteger(), nullable=True))
    op.execute(_FIGURES)
    op.alter_column("usage_ledger", "gpu_count", nullable=False)
    op.execute(_DOWNGRADE)
