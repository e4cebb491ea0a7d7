"""Every writer sorts namespaces as db/locks.py says, in Python and in SQL alike: two orders that differ
for some names would let two writers lock the same rows in opposite orders and deadlock."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from timekeeper.budgets.states.models import NamespaceStatus
from timekeeper.db.locks import NAMESPACE_ORDER_SQL, by_namespace, in_lock_order

# DNS labels a locale's collation sorts otherwise than bytes do (hyphens ignored at first, digits apart).
NAMES = ["ab", "a-c", "a0", "a-b", "b", "a", "a9z", "a-0", "aa"]


async def test_python_and_both_sql_spellings_sort_namespaces_alike(connection: AsyncConnection) -> None:
    await connection.execute(
        sa.insert(NamespaceStatus), [{"namespace": n, "state": "in_budget"} for n in NAMES]
    )
    as_text = await connection.execute(
        sa.text(
            "SELECT namespace FROM namespace_status WHERE namespace = ANY(:names) "
            f"ORDER BY {NAMESPACE_ORDER_SQL}"
        ),
        {"names": NAMES},
    )
    as_orm = await connection.execute(
        sa.select(NamespaceStatus.namespace)
        .where(NamespaceStatus.namespace.in_(NAMES))
        .order_by(by_namespace(NamespaceStatus.namespace))
    )

    expected = in_lock_order(NAMES)
    assert list(as_text.scalars()) == expected
    assert list(as_orm.scalars()) == expected
