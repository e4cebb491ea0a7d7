"""SQL for the audit log (append-only)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from timekeeper.audit.models import AuditEntry
from timekeeper.auth.base import Principal

log = logging.getLogger(__name__)


class AuditRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def record(
        self, at: datetime, actor: Principal, action: str, namespace: str | None, old: Any, new: Any
    ) -> None:
        """`actor` is recorded by name and by the cluster that authenticated it (a Principal, not a name, so
        no caller can leave the cluster out)."""
        log.info(
            "admin_change",
            extra={
                "action": action,
                "namespace": namespace,
                "actor": actor.name,
                "actor_cluster": actor.cluster,
            },
        )
        # Core, not session.add(): the audit row is written as one statement in the caller's transaction,
        # and JSON null stays SQL NULL (none_as_null is not the column's default).
        await self.session.execute(
            sa.insert(AuditEntry).values(
                at=at,
                actor=actor.name,
                actor_cluster=actor.cluster,
                action=action,
                namespace=namespace,
                old_value=sa.null() if old is None else old,
                new_value=sa.null() if new is None else new,
            )
        )

    async def entries(
        self, namespace: str | None, since: datetime | None, limit: int, before_id: int | None
    ) -> Sequence[AuditEntry]:
        """Newest first; page with before_id."""
        query = sa.select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)
        if namespace is not None:
            query = query.where(AuditEntry.namespace == namespace)
        if since is not None:
            query = query.where(AuditEntry.at >= since)
        if before_id is not None:
            query = query.where(AuditEntry.id < before_id)
        return (await self.session.scalars(query)).all()
