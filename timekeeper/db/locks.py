"""The one order every writer takes row locks in, so concurrent transactions (batches, replicas, jobs,
admin changes) never deadlock: the tables in LOCK_ORDER, and within a table the rows in key order.
Namespaces sort in byte order, as Python's sorted() and PostgreSQL's "C" collation do."""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa
from sqlalchemy.orm import InstrumentedAttribute

LOCK_ORDER = (
    "pod_coverage",
    "usage_totals",
    "usage_model_totals",
    "usage_burn",
    "usage_model_burn",
    "namespace_status",
    "admission_version",
)
# Table locks stay out of this order: the ledger's partition DDL (usage/partitions.py) takes ACCESS
# EXCLUSIVE on usage_ledger only with NOWAIT, so it never waits while it holds row locks of its own.

# A statement's ORDER BY over the rows of one namespace each, in the lock order.
NAMESPACE_ORDER_SQL = 'namespace COLLATE "C"'


def in_lock_order(namespaces: Iterable[str]) -> list[str]:
    return sorted(set(namespaces))


def by_namespace(column: InstrumentedAttribute[str]) -> sa.ColumnElement[str]:
    """`column` (a namespace) as an ORDER BY in the lock order."""
    return column.collate("C")
