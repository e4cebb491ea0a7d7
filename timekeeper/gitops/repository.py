"""SQL for the budgets Kubernetes objects govern."""

from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from timekeeper.gitops.models import ManagedBudget
from timekeeper.gitops.objects import ObjectRef


class ManagedRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def owner(self, key: str) -> tuple[str, str] | None:
        """(kind, name) of the object governing `key` (a namespace, or "" for the default), if any."""
        row = (
            await self.session.execute(
                sa.select(ManagedBudget.kind, ManagedBudget.name).where(ManagedBudget.key == key)
            )
        ).one_or_none()
        return None if row is None else (row.kind, row.name)

    async def all(self) -> dict[str, ObjectRef]:
        rows = (await self.session.execute(sa.select(ManagedBudget))).scalars()
        return {row.key: ObjectRef(row.kind, row.key or None, row.name, row.uid, 0) for row in rows}

    async def claim(self, ref: ObjectRef, now: datetime) -> None:
        statement = insert(ManagedBudget).values(
            key=ref.key, kind=ref.kind, name=ref.name, uid=ref.uid, seen_at=now
        )
        await self.session.execute(
            statement.on_conflict_do_update(
                index_elements=[ManagedBudget.key],
                set_={"kind": ref.kind, "name": ref.name, "uid": ref.uid, "seen_at": now},
            )
        )

    async def release(self, key: str) -> None:
        await self.session.execute(sa.delete(ManagedBudget).where(ManagedBudget.key == key))
