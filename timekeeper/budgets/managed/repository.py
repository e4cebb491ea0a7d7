"""SQL for the budgets Kubernetes objects govern."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from timekeeper.budgets.managed.models import ManagedBudget


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """Which object a budget comes from: named in the audit log, the 409 and the status. `namespace` is
    the namespace key it governs (`team-a`, or `b/team-a` for member b's object, docs/fleet.md)."""

    kind: str
    namespace: str | None
    name: str
    uid: str
    generation: int

    @property
    def key(self) -> str:
        """What it governs: its namespace, or "" for the cluster default (no namespace is named "")."""
        return self.namespace or ""

    @property
    def display(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}" if self.namespace else f"{self.kind} {self.name}"

    @property
    def actor(self) -> str:
        """The audit log's `actor` for changes the sync makes on this object's behalf."""
        return f"gitops:{self.display}"


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
