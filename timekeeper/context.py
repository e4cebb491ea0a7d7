"""The one typed context: what the lifespan (timekeeper/app.py) builds for a running app, and the one
dependency, `ContextDep`, through which routes reach it.

Why slots: the auth dependencies (floor 6) and the routers (the domain floor) both reach the context, so it
sits on the lowest floor beside settings and clock, which it names (pyproject.toml's layers contract; a
separate contract keeps the floor's other modules independent). From there it may name no type from a
floor above: what those floors own (access control, metrics, the ingest batcher, the caches) sits in
typed slots, each `Slot` declared by its owner beside its type, and `context[SLOT]` has the slot's type.
A domain's service dependency (e.g. budgets.router.BudgetServiceDep) is built from `ContextDep`."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Generic, Protocol, TypeVar, cast

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from timekeeper.clock import Clock
from timekeeper.settings import Settings

T = TypeVar("T")
Sessions = async_sessionmaker[AsyncSession]


class Slot(Generic[T]):
    """A typed key of `Context.parts`, declared once by the floor that owns `T`."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Slot({self.name!r})"


class JobsStatus(Protocol):
    """The scheduler runner as /readyz shows it (timekeeper/periodic/runner.py)."""

    def status(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Context:
    """Everything a request may need, built once per app start. Tests build one too (`dataclasses.replace`
    on the started app's, exposed with timekeeper.app.expose) instead of swapping attributes."""

    settings: Settings
    clock: Clock
    engine: AsyncEngine
    sessions: Sessions  # writes: a transaction per request (db.session.SessionDep)
    reads: Sessions  # reads: autocommit on the same pool (db.session.ReadsDep)
    export_engine: AsyncEngine
    export_sessions: Sessions  # the chargeback exports' own pool
    known_namespaces: Callable[[Sessions], Awaitable[Sequence[str]]]
    scheduler: JobsStatus | None
    parts: Mapping[Slot[Any], object]

    def __getitem__(self, slot: Slot[T]) -> T:
        return cast(T, self.parts[slot])

    def with_part(self, slot: Slot[T], value: T) -> Context:
        """This context with `slot` holding `value` (a test's stand-in)."""
        return dataclasses.replace(self, parts={**self.parts, slot: value})


def context_of(request: Request) -> Context:
    """The context of the app serving `request`. Routes take `ContextDep`; the report route's chain
    (authentication, its metrics) calls this itself, since each dependency FastAPI solves costs every
    report a few microseconds (bench/report_route.py)."""
    context: Context = request.app.state.context
    return context


async def _context(request: Request) -> Context:
    return context_of(request)


ContextDep = Annotated[Context, Depends(_context)]
