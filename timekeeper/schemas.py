"""Types every domain's schemas share: Kubernetes names, exact amounts answered as JSON numbers."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    Field,
    GetJsonSchemaHandler,
    PlainSerializer,
    WithJsonSchema,
)
from pydantic_core import CoreSchema

from gpuaccounting.names import CLUSTER_HEADER, DNS_SUBDOMAIN
from gpuaccounting.wire import parse_timestamp
from timekeeper.domain.clusters import NAMESPACE_KEY_LENGTH, NAMESPACE_KEY_PATTERN
from timekeeper.domain.periods import EPOCH, PeriodKind, period_containing
from timekeeper.settings import NamespaceName as NamespaceName  # defined with the settings that need it first

# A namespace key (timekeeper/domain/clusters.py) where a hub's own principal may name another cluster's
# namespace; a member cluster's principal names bare namespaces, which mean its cluster's.
NamespaceKeyName = Annotated[
    str, Field(min_length=1, max_length=NAMESPACE_KEY_LENGTH, pattern=NAMESPACE_KEY_PATTERN)
]
# Beside a namespace in an answer: the member cluster it is in (docs/fleet.md); null for the local cluster,
# so a single cluster's answers read as before. Every answer that names a namespace names it so: the bare
# namespace and this (timekeeper/domain/clusters.py split_key), never the key, except where an admin wrote
# keys (a pool's members, the audit log's namespace).
ClusterField = Annotated[str | None, Field(description="the member cluster; null: the local cluster")]
PodName = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]
PodUid = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9-]+$")]
# Free text stored in PostgreSQL, whose text and jsonb refuse the NUL character.
StoredText = Annotated[str, Field(pattern=r"^[^\x00]*$")]

_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})")
# Before the Unix epoch nothing reports GPU use; a timestamp outside [1970, 9000) is refused here, so the
# period arithmetic never meets a date it cannot represent (year 1 at +01:00 is before year 1 in UTC).
_EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
_LATEST = datetime(9000, 1, 1, tzinfo=UTC)


def _rfc3339(value: object) -> datetime:
    """An RFC 3339 string, in UTC; pydantic's lax mode would also take Unix seconds and other forms. (A
    datetime object, which JSON cannot carry, is taken as it is: the reconciler builds reports in Python.)"""
    if not isinstance(value, str | datetime) or (
        _RFC3339.fullmatch(value) is None if isinstance(value, str) else value.tzinfo is None
    ):
        raise ValueError("must be an RFC 3339 timestamp string, e.g. 2026-03-18T12:00:00Z")
    try:
        moment = parse_timestamp(value) if isinstance(value, str) else value.astimezone(UTC)
    except (ValueError, OverflowError) as error:
        raise ValueError(f"not a representable time: {error}") from None
    if not _EARLIEST <= moment < _LATEST:
        raise ValueError("must lie between 1970 and 9000")
    return moment


def _json_number(value: object) -> object:
    """A JSON number; pydantic's lax mode would also take the string "0.5" and true."""
    if isinstance(value, bool) or not isinstance(value, int | float | Decimal):
        raise ValueError("must be a JSON number")
    return value


Timestamp = Annotated[
    AwareDatetime, BeforeValidator(_rfc3339), WithJsonSchema({"type": "string", "format": "date-time"})
]
# An exact decimal inside, sent as a JSON number (the OpenAPI says so rather than "number or any string").
DecimalNumber = Annotated[Decimal, BeforeValidator(_json_number), WithJsonSchema({"type": "number"})]


# An amount a client sends: a JSON number, or a string of at most 64 characters holding a plain decimal
# number in this form (pydantic alone would also take "1_000" and " 1.5 ", and document the string as any
# string at all; "0E-20000" or 20,000 decimals would overflow PostgreSQL's numeric).
DECIMAL_TEXT = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]{1,3})?$"
DECIMAL_TEXT_LENGTH = 64


def _plain_decimal_text(value: object) -> object:
    if isinstance(value, str) and (
        len(value) > DECIMAL_TEXT_LENGTH or re.fullmatch(DECIMAL_TEXT, value) is None
    ):
        raise ValueError(
            f"a number given as a string must match {DECIMAL_TEXT}"
            f" in at most {DECIMAL_TEXT_LENGTH} characters"
        )
    return value


class _DecimalTextSchema:
    """Puts DECIMAL_TEXT on the string alternative of a Decimal's JSON schema, keeping its bounds."""

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        documented = handler(schema)
        for alternative in documented.get("anyOf", [documented]):
            if alternative.get("type") == "string":
                alternative |= {"pattern": DECIMAL_TEXT, "maxLength": DECIMAL_TEXT_LENGTH}
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
    400: f"{CLUSTER_HEADER} names no member cluster of this timekeeper",
    401: "no token, or a token not accepted",
    403: "the token may not do this",
    404: "nothing to act on",
    409: "a conflict: the pod uid reports for another namespace; a GPUBudget object governs the budget",
    413: "the body is larger than the configured limit",
    422: "malformed: the request's shape (a list of errors) or a configured limit (a sentence)",
    429: "too many at once: retry after the seconds in Retry-After",
    503: "the database does not answer",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` for the refusals an operation can answer, all `{"detail": ...}`."""
    return {code: {"model": ErrorOut, "description": _ERRORS[code]} for code in codes}


# Every operation under /api/v1 reads the caller's cluster, authenticates and validates its parameters; one
# with a body limits its size.
API_ERRORS = error_responses(400, 401, 403, 422)
BODY_ERRORS = error_responses(413)


LARGEST_AMOUNT = Decimal("1e12")  # a trillion GPU-minutes: anything above is a typo


class PeriodOut(BaseModel):
    kind: PeriodKind
    start: datetime | None  # None for `none`: one open-ended period
    end: datetime | None


def period_out(kind: PeriodKind, moment: datetime) -> PeriodOut:
    period = period_containing(kind, moment)
    return PeriodOut(kind=kind, start=None if period.start == EPOCH else period.start, end=period.end)
