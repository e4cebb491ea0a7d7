"""Lists bound one parameter per item, and long lists as one array: the same rows either way."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from timekeeper.budgets.repository import BudgetRepository
from timekeeper.db.lists import ONE_BY_ONE, arity

NOW = datetime(2026, 3, 18, 12, 0, tzinfo=UTC)


def test_short_lists_are_bound_item_by_item_padded_to_a_power_of_two_long_ones_as_one_array() -> None:
    counts = (0, 1, 2, 3, 5, ONE_BY_ONE, ONE_BY_ONE + 1)
    assert [arity(count) for count in counts] == [0, 1, 2, 4, 8, ONE_BY_ONE, None]


async def test_figures_of_a_long_list_are_those_of_its_parts(connection: AsyncConnection) -> None:
    """Exactly the listed namespaces, known or not, each once, whichever way the list is bound."""
    await connection.exec_driver_sql(
        "INSERT INTO namespace_budgets (namespace, budget_gpu_minutes, period, warn_at_fraction, updated_at, "
        "updated_by) SELECT 'ns-' || i, i, 'monthly', 0.8, now(), 'test' FROM generate_series(1, 40) AS i"
    )
    budgets = BudgetRepository(AsyncSession(bind=connection, join_transaction_mode="create_savepoint"))
    names = [f"ns-{i}" for i in range(1, ONE_BY_ONE + 11)]
    whole = await budgets.figures(NOW, [*names, names[0]])
    parts = await budgets.figures(NOW, names[:ONE_BY_ONE]) + await budgets.figures(NOW, names[ONE_BY_ONE:])
    assert arity(len(names)) is None and arity(ONE_BY_ONE) is not None
    assert [f.namespace for f in whole] == sorted(names)
    assert sorted(whole, key=lambda f: f.namespace) == sorted(parts, key=lambda f: f.namespace)
    assert [f.config.budget_gpu_minutes for f in whole if f.namespace == "ns-7"] == [7]
    assert await budgets.figures(NOW, []) == []
