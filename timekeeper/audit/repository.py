"""SQL for the audit log (append-only)."""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

log = logging.getLogger(__name__)


class AuditRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def record(
        self, at: datetime, actor: str, action: str, namespace: str | None, old: Any, new: Any
    ) -> None:
        log.info("admin_change", extra={"action": action, "namespace": namespace, "actor": actor})
        await self.session.execute(
            sa.text(
                "INSERT INTO audit_log (at, actor, action, namespace, old_value, new_value) "
                "VALUES (:at, :actor, :action, :namespace, CAST(:old AS jsonb), CAST(:new AS jsonb))"
            ),
            {
                "at": at,
                "actor": actor,
                "action": action,
                "namespace": namespace,
                "old": None if old is None else json.dumps(old),
                "new": None if new is None else json.dumps(new),
            },
        )

    async def entries(
        self, namespace: str | None, since: datetime | None, limit: int, before_id: int | None
    ) -> list[Any]:
        """Newest first; page with before_id."""
        result = await self.session.execute(
            sa.text(
                "SELECT id, at, actor, action, namespace, old_value, new_value FROM audit_log "
                "WHERE (CAST(:namespace AS text) IS NULL OR namespace = :namespace) "
                "AND (CAST(:since AS timestamptz) IS NULL OR at >= :since) "
                "AND (CAST(:before_id AS bigint) IS NULL OR id < :before_id) "
                "ORDER BY id DESC LIMIT :limit"
            ),
            {"namespace": namespace, "since": since, "limit": limit, "before_id": before_id},
        )
        return list(result)
