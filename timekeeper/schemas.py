"""Types every domain's schemas share: Kubernetes names, exact amounts answered as JSON numbers."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any

from fastapi import Path
from pydantic import BaseModel, BeforeValidator, Field, GetJsonSchemaHandler, PlainSerializer
from pydantic_core import CoreSchema

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

# An amount a client sends: a JSON number, or a string holding a plain decimal number in this form
# (pydantic alone would also take "1_000" and " 1.5 ", and document the string as any string at all).
DECIMAL_TEXT = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?$"


def _plain_decimal_text(value: object) -> object:
    if isinstance(value, str) and re.fullmatch(DECIMAL_TEXT, value) is None:
        raise ValueError(f"a number given as a string must match {DECIMAL_TEXT}")
    return value


class _DecimalTextSchema:
    """Puts DECIMAL_TEXT on the string alternative of a Decimal's JSON schema, keeping its bounds."""

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        documented = handler(schema)
        for alternative in documented.get("anyOf", [documented]):
            if alternative.get("type") == "string":
                alternative["pattern"] = DECIMAL_TEXT
        return documented


DecimalIn = Annotated[Decimal, BeforeValidator(_plain_decimal_text), _DecimalTextSchema()]
OptionalDecimalIn = Annotated[Decimal | None, BeforeValidator(_plain_decimal_text), _DecimalTextSchema()]

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
