"""Lists of names bound one parameter per item (`ARRAY[:name_0, :name_1]`), padded to a power of two, so
the plan PostgreSQL keeps for a prepared statement counts the list as a fresh plan does and is kept
(docs/performance.md, "Plans"); the statements read the list as a set."""

from __future__ import annotations

from collections.abc import Sequence

# Longer lists (a sweep, a pool's members) are rare: one array parameter, planned on each run.
ONE_BY_ONE = 64


def arity(count: int) -> int | None:
    """How a list of `count` items is bound: as many parameters (the next power of two), or None for one
    array parameter."""
    if count > ONE_BY_ONE:
        return None
    return 1 << (count - 1).bit_length() if count else 0


def array_sql(name: str, arity: int | None, parameter: str = ":{}") -> str:
    """The text[] of list `name` bound as `arity` says, its parameters written as `parameter` (a text
    statement's `:name`; psycopg's `%({})s`)."""
    if arity is None:
        return f"CAST({parameter.format(name)} AS text[])"
    items = (f"CAST({parameter.format(f'{name}_{i}')} AS text)" for i in range(arity))
    return f"CAST(ARRAY[{', '.join(items)}] AS text[])"


def array_parameters(name: str, values: Sequence[str]) -> dict[str, object]:
    """The parameters of list `name` (array_sql's, for `arity(len(values))`)."""
    bound = arity(len(values))
    if bound is None:
        return {name: list(values)}
    padded = [*values, *[values[-1]] * (bound - len(values))] if values else []
    return {f"{name}_{index}": value for index, value in enumerate(padded)}
