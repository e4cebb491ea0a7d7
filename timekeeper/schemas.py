"""Types every domain's schemas share: Kubernetes names, exact amounts answered as JSON numbers."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Any

from fastapi import Path
from pydantic import BaseModel, Field, PlainSerializer

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

NamespaceName = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL)]
PodName = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]
PodUid = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9-]+$")]
# Free text stored in PostgreSQL, whose text and jsonb refuse the NUL character.
StoredText = Annotated[str, Field(pattern=r"^[^\x00]*$")]
NamespacePath = Annotated[
    str, Path(min_length=1, max_length=63, pattern=DNS_LABEL, description="a namespace")
]

# Amounts are exact Decimals inside; on the wire they are plain JSON numbers.
Amount = Annotated[Decimal, PlainSerializer(float, return_type=float, when_used="json")]
OptionalAmount = Annotated[
    Decimal | None,
    PlainSerializer(lambda v: None if v is None else float(v), return_type=float | None, when_used="json"),
]


class ErrorOut(BaseModel):
    """Every refusal: a sentence, or (for a malformed request) pydantic's list of what was wrong."""

    detail: str | list[dict[str, Any]]


_ERRORS = {
    401: "no token, or a token not accepted",
    403: "the token may not do this",
    404: "nothing to act on",
    409: "the pod uid already reports for another namespace",
    413: "the body is larger than the configured limit",
    422: "malformed: the request's shape (a list of errors) or a configured limit (a sentence)",
    503: "the database does not answer",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` for the refusals an operation can answer, all `{"detail": ...}`."""
    return {code: {"model": ErrorOut, "description": _ERRORS[code]} for code in codes}


# Every operation under /api/v1 authenticates and validates its parameters; one with a body limits its size.
API_ERRORS = error_responses(401, 403, 422)
BODY_ERRORS = error_responses(413)
