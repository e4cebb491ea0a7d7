"""AdmissionReview in: one typed model parsed once from the body (the Pod's shape included). A body that is
not an AdmissionReview raises `MalformedReview` (400); a refusal of a well-formed request is a decision's
(`webhook.decisions.answer`)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Final, Literal

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    ValidationInfo,
    model_validator,
)

from httpguard.nesting import deeper_than
from webhook.reviews.podshape import PodObject

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
_ERRORS_SHOWN: Final = 3
CONTAINER_LISTS: Final = ("initContainers", "containers", "ephemeralContainers")
# How deep a review may nest: a JobSet's pod affinity is about 20 levels down. A patch carries parts of
# the review, and orjson writes no more than 255 levels; deeper is refused before anything reads it.
MAX_REVIEW_DEPTH: Final = 128


class WebhookError(Exception):
    """The webhook's one error base: a message and the HTTP status it is answered with."""

    status_code = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class MalformedReview(WebhookError):
    status_code = 400


class _Model(BaseModel):
    # Strict: the API server sends exactly these JSON types, anything else is a broken client.
    model_config = ConfigDict(strict=True, frozen=True, extra="ignore")


class GroupVersionKind(_Model):
    group: str = ""
    version: str = ""
    kind: str


class UserInfo(_Model):
    username: str = ""


class _Request(_Model):
    uid: Annotated[str, Field(min_length=1)]
    kind: GroupVersionKind
    operation: Operation
    namespace: str | None = None
    name: str | None = None
    subresource: str | None = Field(default=None, alias="subResource")
    dry_run: bool = Field(default=False, alias="dryRun")
    user_info: UserInfo | None = Field(default=None, alias="userInfo")

    @property
    def username(self) -> str:
        return self.user_info.username if self.user_info else ""


class PodRequest(_Request):
    """A request about a core/v1 Pod: its objects have the shape the decisions read."""

    object: PodObject | None = None
    old_object: PodObject | None = Field(default=None, alias="oldObject")
    # The containers `object` lists (init, app, ephemeral), counted before it is read. The pod of a CREATE
    # over the cap the parse is given is kept as its metadata only: it is denied, never read.
    container_count: int = 0
    is_pod: ClassVar[bool] = True

    @model_validator(mode="before")
    @classmethod
    def _count_containers(cls, data: Any, info: ValidationInfo) -> Any:
        pod = data.get("object") if isinstance(data, dict) else None
        if not isinstance(pod, dict) or not isinstance(spec := pod.get("spec"), dict):
            return data
        count = sum(len(listed) for key in CONTAINER_LISTS if isinstance(listed := spec.get(key), list))
        cap = (info.context or {}).get("max_containers")
        if cap is not None and count > cap and data.get("operation") == "CREATE":
            pod = {key: pod[key] for key in ("apiVersion", "kind", "metadata") if key in pod}
        return {**data, "object": pod, "container_count": count}


class OtherRequest(_Request):
    """A request about anything else (the webhook is registered for Pods only): answered unchanged."""

    object: dict[str, Any] | None = None
    old_object: dict[str, Any] | None = Field(default=None, alias="oldObject")
    is_pod: ClassVar[bool] = False


def _request_kind(request: Any) -> str:
    kind = request.get("kind") if isinstance(request, dict) else None
    if isinstance(kind, dict) and (kind.get("group") or "", kind.get("version"), kind.get("kind")) == (
        "",
        "v1",
        "Pod",
    ):
        return "pod"
    return "other"


AdmissionRequest = Annotated[
    Annotated[PodRequest, Tag("pod")] | Annotated[OtherRequest, Tag("other")], Discriminator(_request_kind)
]


class AdmissionReview(_Model):
    api_version: Literal["admission.k8s.io/v1", "admission.k8s.io/v1beta1"] = Field(alias="apiVersion")
    kind: Literal["AdmissionReview"]
    request: AdmissionRequest


def _place(location: tuple[int | str, ...]) -> str:
    """A pydantic error location as a path in the review; the union's tag is not part of the body."""
    if location[:1] == ("request",) and location[1:2] in (("pod",), ("other",)):
        location = location[:1] + location[2:]
    return ".".join(str(part) for part in location) or "body"


def parse_review(body: bytes, max_containers: int | None = None) -> AdmissionReview:
    """Parse an AdmissionReview; anything that is not one raises MalformedReview naming the places. orjson
    reads the document (the pod-kind test and the container count need it first), the model validates it."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise MalformedReview(f"body: not valid JSON: {error}") from None
    if deeper_than(document, MAX_REVIEW_DEPTH):
        raise MalformedReview(f"body: nested deeper than {MAX_REVIEW_DEPTH} levels")
    try:
        return AdmissionReview.model_validate(document, context={"max_containers": max_containers})
    except ValidationError as error:
        problems = error.errors(include_url=False, include_input=False)
        shown = "; ".join(f"{_place(p['loc'])}: {p['msg']}" for p in problems[:_ERRORS_SHOWN])
        more = len(problems) - _ERRORS_SHOWN
        raise MalformedReview(shown + (f" (and {more} more)" if more > 0 else "")) from None
