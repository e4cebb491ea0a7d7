"""AdmissionReview in and out: a typed request parsed from raw JSON, and a pure response builder.

Two kinds of "no" are kept apart, as kopf does: `AdmissionDenied` is a well-formed request the rules refuse
(an answer of `allowed: false`, code 403, with the message), `MalformedReview` is a body that is not an
AdmissionReview at all (an HTTP 400, the API server then applies the webhook's failurePolicy).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Final, Literal, cast

import orjson

from webhook.podshape import pod_shape_error

API_VERSIONS: Final = frozenset({"admission.k8s.io/v1", "admission.k8s.io/v1beta1"})
OPERATIONS: Final = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]


class WebhookError(Exception):
    """The webhook's one error base: a message and the HTTP status it is answered with."""

    status_code = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class MalformedReview(WebhookError):
    status_code = 400


class AdmissionDenied(WebhookError):
    """The request is well formed and refused; answered inside a 200 AdmissionReview."""

    status_code = 403


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    api_version: str
    uid: str
    kind: str
    group: str
    version: str
    operation: Operation
    namespace: str
    name: str
    subresource: str
    dry_run: bool
    username: str
    object: dict[str, Any] | None
    old_object: dict[str, Any] | None

    @property
    def is_pod(self) -> bool:
        return self.kind == "Pod" and self.group == "" and self.version == "v1"


def _optional_object(request: dict[str, Any], key: str) -> dict[str, Any] | None:
    value = request.get(key)
    if value is None or isinstance(value, dict):
        return value
    raise MalformedReview(f"request.{key} must be an object or null, got {type(value).__name__}")


def _text(container: dict[str, Any], key: str, where: str, *, required: bool = False) -> str:
    value = container.get(key)
    if value is None:
        if required:
            raise MalformedReview(f"{where}.{key} is missing")
        return ""
    if not isinstance(value, str):
        raise MalformedReview(f"{where}.{key} must be a string, got {type(value).__name__}")
    return value


def parse_review(body: bytes) -> AdmissionRequest:
    """Parse an AdmissionReview body; anything that is not one raises MalformedReview with the reason."""
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise MalformedReview(f"body is not valid JSON: {error}") from None
    if not isinstance(review, dict):
        raise MalformedReview("body must be a JSON object (an AdmissionReview)")
    api_version = review.get("apiVersion")
    if not isinstance(api_version, str) or api_version not in API_VERSIONS:
        raise MalformedReview(f"apiVersion must be one of {sorted(API_VERSIONS)}, got {api_version!r}")
    if review.get("kind") != "AdmissionReview":
        raise MalformedReview(f"kind must be 'AdmissionReview', got {review.get('kind')!r}")
    request = review.get("request")
    if not isinstance(request, dict):
        raise MalformedReview("request is missing or not an object")
    uid = _text(request, "uid", "request", required=True)
    if not uid:
        raise MalformedReview("request.uid is empty")
    kind = request.get("kind")
    if not isinstance(kind, dict):
        raise MalformedReview("request.kind must be an object {group, version, kind}")
    operation = request.get("operation")
    if not isinstance(operation, str) or operation not in OPERATIONS:
        raise MalformedReview(f"request.operation must be one of {sorted(OPERATIONS)}, got {operation!r}")
    user_info = request.get("userInfo")
    parsed = AdmissionRequest(
        api_version=api_version,
        uid=uid,
        kind=_text(kind, "kind", "request.kind", required=True),
        group=_text(kind, "group", "request.kind"),
        version=_text(kind, "version", "request.kind"),
        operation=cast(Operation, operation),  # checked against OPERATIONS above
        namespace=_text(request, "namespace", "request"),
        name=_text(request, "name", "request"),
        subresource=_text(request, "subResource", "request"),
        dry_run=request.get("dryRun") is True,
        username=_text(user_info, "username", "request.userInfo") if isinstance(user_info, dict) else "",
        object=_optional_object(request, "object"),
        old_object=_optional_object(request, "oldObject"),
    )
    if parsed.is_pod:
        for key, pod in (("object", parsed.object), ("oldObject", parsed.old_object)):
            if pod is not None and (problem := pod_shape_error(pod)) is not None:
                raise MalformedReview(f"request.{key} is not a Pod the webhook can read: {problem}")
    return parsed


def build_response(
    request: AdmissionRequest,
    *,
    patch: list[dict[str, Any]] | None = None,
    denied: AdmissionDenied | None = None,
    warnings: list[str] | None = None,
) -> bytes:
    """The AdmissionReview answer, in the request's apiVersion; a patch is base64-encoded JSONPatch."""
    response: dict[str, Any] = {"uid": request.uid, "allowed": denied is None}
    if denied is not None:
        response["status"] = {"code": denied.status_code, "reason": "Forbidden", "message": denied.message}
    elif patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
    if warnings:
        response["warnings"] = warnings
    return orjson.dumps({"apiVersion": request.api_version, "kind": "AdmissionReview", "response": response})
