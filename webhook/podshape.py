"""The shape of the parts of a Pod the webhook reads, checked as part of parsing the review.

The API server only sends Pods it has decoded into its own types, but the webhook must never answer a
500: an object whose containers are not a list, whose annotations are not strings, whose resource
quantities are objects, is a malformed review (400) with the place named, rather than an exception deep
in the share arithmetic or the injection. Everything not listed here is passed through unread.
"""

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
