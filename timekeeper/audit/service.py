"""The audit log as the API reads it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from timekeeper.audit.models import AuditEntry
from timekeeper.audit.repository import AuditRepository


class AuditService:
    def __init__(self, session: AsyncSession) -> None:
        self.repository = AuditRepository(session)

    async def entries(
        self, namespace: str | None, since: datetime | None, limit: int, before_id: int | None
    ) -> Sequence[AuditEntry]:
        """Newest first; page with before_id."""
        return await self.repository.entries(namespace, since, limit, before_id)
