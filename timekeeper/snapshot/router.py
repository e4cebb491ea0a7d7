"""GET /admission-state: the snapshot webhooks poll, with an ETag so an unchanged poll costs one row."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request, Response

from timekeeper.auth.dependencies import Reader
from timekeeper.db.session import SessionDep, read
from timekeeper.schemas import NamespacePath, Timestamp
from timekeeper.snapshot.schemas import BudgetEventOut
from timekeeper.snapshot.service import SnapshotService

router = APIRouter(tags=["admission"])


def _etag(version: int) -> str:
    return f'"{version}"'


@router.get(
    "/admission-state",
    responses={
        200: {"description": "gpuaccounting.admission_state.AdmissionSnapshot"},
        304: {"description": "unchanged"},
    },
)
async def admission_state(
    request: Request,
    _: Reader,
    if_none_match: Annotated[
        str | None, Header(description="the ETag of the snapshot the caller holds")
    ] = None,
) -> Response:
    """The gpuaccounting.admission_state.AdmissionSnapshot snapshot; 304 when If-None-Match names its
    version. Read in autocommit: polling writes nothing."""
    known = (
        set()
        if if_none_match is None
        else {tag.strip().removeprefix("W/") for tag in if_none_match.split(",")}
    )
    state = request.app.state
    version, body = await read(
        state.read_sessionmaker,
        lambda session: SnapshotService(session, state.settings).snapshot_json(
            state.clock.now(),
            lambda version: _etag(version) in known,
            cache=state.snapshot_cache,
            source=state.read_sessionmaker,
        ),
    )
    if body is None:
        return Response(status_code=304, headers={"ETag": _etag(version)})
    return Response(body, media_type="application/json", headers={"ETag": _etag(version)})


@router.get("/namespaces/{namespace}/budget/events", response_model=list[BudgetEventOut])
async def budget_events(
    request: Request,
    namespace: NamespacePath,
    session: SessionDep,
    _: Reader,
    since: Timestamp | None = None,
    before_id: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,  # a bigint id
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[BudgetEventOut]:
    """The namespace's budget-state transitions (whichever path made them: a report, an admin change,
    a job), newest first; page with before_id."""
    service = SnapshotService(session, request.app.state.settings)
    rows = await service.events(namespace, since, limit, before_id)
    return [BudgetEventOut.model_validate(row, from_attributes=True) for row in rows]
