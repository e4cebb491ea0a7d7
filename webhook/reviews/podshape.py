"""The shape of the parts of a Pod the webhook reads, checked while parsing the review: a wrong type is a
malformed review (400) naming the place, never a 500 deep in the arithmetic.
The rest passes through unread."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, GetPydanticSchema, with_config

# pydantic needs typing_extensions' TypedDict on Python < 3.12.
from typing_extensions import TypedDict

_STRICT = ConfigDict(strict=True, extra="allow")
Quantity = str | int | float


@with_config(_STRICT)
class _Resources(TypedDict, total=False):
    requests: dict[str, Quantity] | None
    limits: dict[str, Quantity] | None


@with_config(_STRICT)
class _Named(TypedDict, total=False):
    name: str | None


@with_config(_STRICT)
class _EnvVar(TypedDict, total=False):
    name: str | None
    value: str | None


@with_config(_STRICT)
class _Container(TypedDict, total=False):
    name: str | None
    image: str | None
    restartPolicy: str | None
    resources: _Resources | None
    env: list[_EnvVar] | None
    volumeMounts: list[_Named] | None


@with_config(_STRICT)
class _Spec(TypedDict, total=False):
    containers: list[_Container] | None
    initContainers: list[_Container] | None
    ephemeralContainers: list[_Container] | None
    volumes: list[_Named] | None
    priorityClassName: str | None
    priority: int | None
    preemptionPolicy: str | None


@with_config(_STRICT)
class _Metadata(TypedDict, total=False):
    name: str | None
    namespace: str | None
    generateName: str | None
    labels: dict[str, str] | None
    annotations: dict[str, str] | None


@with_config(_STRICT)
class _Pod(TypedDict, total=False):
    metadata: _Metadata | None
    spec: _Spec | None


# What the review's model declares for a Pod: validated as _Pod, typed (and kept) as the plain JSON object
# the decisions read and the patch is diffed against.
PodObject = Annotated[dict[str, Any], GetPydanticSchema(lambda _, handler: handler(_Pod))]
