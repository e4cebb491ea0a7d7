"""What a decision answers, before and after it is encoded: an `AdmissionResponse` (a refusal carries a
`Denial`: 200, `allowed: false`) and the pure builder of the AdmissionReview the API server reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson
import pybase64

from webhook.decisions.priority import PriorityDecision
from webhook.reviews.review import AdmissionReview

# What each decision answered: the `result` label of webhook_admissions_total.
Result = Literal["patched", "unchanged", "non_gpu", "skipped", "allowed", "warned", "denied"]


@dataclass(frozen=True, slots=True)
class Denial:
    """Why a well-formed request is refused: the message a user reads and the rules that refused it."""

    message: str
    rules: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class AdmissionResponse:
    """A decision, before it is encoded: the endpoint serialises it and counts it by `result`, and the
    priority decision a GPU pod's mutation made by its rule (neither for a dryRun review)."""

    result: Result
    patch: tuple[dict[str, Any], ...] = ()
    warnings: tuple[str, ...] = ()
    denial: Denial | None = None
    priority: PriorityDecision | None = None


def build_response(review: AdmissionReview, answer: AdmissionResponse) -> bytes:
    """The AdmissionReview answer, in the request's apiVersion; a patch is base64-encoded JSONPatch."""
    response: dict[str, Any] = {"uid": review.request.uid, "allowed": answer.denial is None}
    if answer.denial is not None:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": answer.denial.message}
    elif answer.patch:
        response["patchType"] = "JSONPatch"
        # pybase64: SIMD base64; the standard library's scalar loop was a large part of a patch's cost
        response["patch"] = pybase64.b64encode_as_string(orjson.dumps(answer.patch))
    if answer.warnings:
        response["warnings"] = answer.warnings
    return orjson.dumps({"apiVersion": review.api_version, "kind": "AdmissionReview", "response": response})
