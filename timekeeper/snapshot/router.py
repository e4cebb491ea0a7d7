"""GET /admission-state: the snapshot webhooks poll, with an ETag so an unchanged poll costs one row."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Response

from timekeeper.auth.dependencies import NamespaceKey, Reader, RequestCluster
from timekeeper.context import ContextDep, Slot
from timekeeper.db.session import ReadsDep, SessionDep
from timekeeper.schemas import Timestamp
from timekeeper.snapshot.schemas import BudgetEventOut
from timekeeper.snapshot.service import SnapshotCache, SnapshotService

router = APIRouter(tags=["admission"])
# The context's slot this domain owns (timekeeper/context.py).
SNAPSHOT_CACHE: Slot[SnapshotCache] = Slot("snapshot_cache")


async def _service(context: ContextDep, session: SessionDep) -> SnapshotService:
    return SnapshotService(session, context.settings)


SnapshotServiceDep = Annotated[SnapshotService, Depends(_service)]


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
    cluster: RequestCluster,
    context: ContextDep,
    reads: ReadsDep,
    _: Reader,
    if_none_match: Annotated[
        str | None, Header(description="the ETag of the snapshot the caller holds")
    ] = None,
) -> Response:
    """The gpuaccounting.admission_state.AdmissionSnapshot snapshot of the caller's cluster (a member's
    webhook sends CLUSTER_HEADER: its namespaces by bare name, docs/fleet.md); 304 when If-None-Match
    names its version. Read in autocommit: polling writes nothing."""
    known = (
        set()
        if if_none_match is None
        else {tag.strip().removeprefix("W/") for tag in if_none_match.split(",")}
    )
    version, body = await reads(
        lambda session: SnapshotService(session, context.settings).snapshot_json(
            context.clock.now(),
            lambda version: _etag(version) in known,
            cache=context[SNAPSHOT_CACHE],
            source=context.reads,
            cluster=cluster,
        ),
    )
    if body is None:
        return Response(status_code=304, headers={"ETag": _etag(version)})
    return Response(body, media_type="application/json", headers={"ETag": _etag(version)})


@router.get("/namespaces/{namespace}/budget/events", response_model=list[BudgetEventOut])
async def budget_events(
    namespace: NamespaceKey,
    service: SnapshotServiceDep,
    _: Reader,
    since: Timestamp | None = None,
    before_id: Annotated[int | None, Query(ge=1, le=2**63 - 1)] = None,  # a bigint id
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[BudgetEventOut]:
    """The namespace's budget-state transitions (whichever path made them: a report, an admin change,
    a job), newest first; page with before_id."""
    rows = await service.events(namespace, since, limit, before_id)
    return [BudgetEventOut.model_validate(row, from_attributes=True) for row in rows]
