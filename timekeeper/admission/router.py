"""GET /admission-state: the snapshot webhooks poll, with an ETag so an unchanged poll costs one row."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Request, Response

from timekeeper.admission.service import AdmissionService
from timekeeper.auth.dependencies import Reader
from timekeeper.db.session import SessionDep

router = APIRouter(tags=["admission"])


def _etag(version: int) -> str:
    return f'"{version}"'


@router.get(
    "/admission-state",
    responses={
        200: {"description": "gpuaccounting.admission_state.AdmissionState"},
        304: {"description": "unchanged"},
    },
)
async def admission_state(
    request: Request,
    session: SessionDep,
    _: Reader,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    service = AdmissionService(session, request.app.state.settings)
    now = request.app.state.clock.now()
    version = await service.version()
    if if_none_match is not None and _etag(version) in {
        tag.strip().removeprefix("W/") for tag in if_none_match.split(",")
    }:
        return Response(status_code=304, headers={"ETag": _etag(version)})
    body = await service.snapshot_json(now, version)
    return Response(body, media_type="application/json", headers={"ETag": _etag(version)})
