"""GET /audit: who changed what, when, old and new value (admin only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from timekeeper.audit.schemas import AuditEntryOut
from timekeeper.audit.service import AuditService
from timekeeper.auth.dependencies import Admin
from timekeeper.db.session import SessionDep
from timekeeper.domain.clusters import NAMESPACE_KEY_LENGTH, NAMESPACE_KEY_PATTERN
from timekeeper.schemas import Timestamp

router = APIRouter(tags=["audit"])


async def _service(session: SessionDep) -> AuditService:
    return AuditService(session)


AuditServiceDep = Annotated[AuditService, Depends(_service)]


@router.get("/audit", response_model=list[AuditEntryOut])
async def list_audit(
    service: AuditServiceDep,
    _: Admin,
    # A namespace key: the hub's admins read every cluster's entries (a member's principal is refused).
    namespace: Annotated[
        str | None, Query(max_length=NAMESPACE_KEY_LENGTH, pattern=NAMESPACE_KEY_PATTERN)
    ] = None,
    since: Timestamp | None = None,
    before_id: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,  # a bigint id
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[AuditEntryOut]:
    rows = await service.entries(namespace, since, limit, before_id)
    return [AuditEntryOut.model_validate(row, from_attributes=True) for row in rows]
