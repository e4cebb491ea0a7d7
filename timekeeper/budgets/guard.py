"""One source of truth per budget: the REST API refuses to change what a Kubernetes object governs."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from gpuaccounting.names import DOMAIN as GROUP
from timekeeper.budgets.managed.repository import ManagedRepository
from timekeeper.errors import TimekeeperError


async def refuse_if_managed(session: AsyncSession, namespace: str | None) -> None:
    """409 naming the object when a GPUBudget governs `namespace` (None: a GPUBudgetDefault the default)."""
    owner = await ManagedRepository(session).owner(namespace or "")
    if owner is None:
        return
    kind, name = owner
    what = f"namespace {namespace}'s budget" if namespace else "the default budget"
    where = f"{namespace}/{name}" if namespace else name
    raise TimekeeperError(
        f"{what} is managed by {kind} {where} ({GROUP}): change or delete that object instead", 409
    )
