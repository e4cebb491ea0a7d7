"""GET /audit: who changed what, when, old and new value (admin only)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from gpuaccounting.names import DNS_LABEL
from timekeeper.audit.schemas import AuditEntryOut
from timekeeper.audit.service import AuditService
from timekeeper.auth.dependencies import Admin
from timekeeper.db.session import SessionDep
from timekeeper.schemas import Timestamp

router = APIRouter(tags=["audit"])


async def _service(session: SessionDep) -> AuditService:
    return AuditService(session)


AuditServiceDep = Annotated[AuditService, Depends(_service)]


@router.get("/audit", response_model=list[AuditEntryOut])
async def list_audit(
    service: AuditServiceDep,
    _: Admin,
    namespace: Annotated[str | None, Query(max_length=63, pattern=DNS_LABEL)] = None,
    since: Timestamp | None = None,
    before_id: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,  # a bigint id
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[AuditEntryOut]:
    rows = await service.entries(namespace, since, limit, before_id)
    return [AuditEntryOut.model_validate(row, from_attributes=True) for row in rows]
