"""Types every domain's schemas share: Kubernetes names, exact amounts answered as JSON numbers."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated

from fastapi import Path
from pydantic import Field, PlainSerializer

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

NamespaceName = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL)]
PodName = Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]
PodUid = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9-]+$")]
NamespacePath = Annotated[
    str, Path(min_length=1, max_length=63, pattern=DNS_LABEL, description="a namespace")
]

# Amounts are exact Decimals inside; on the wire they are plain JSON numbers.
Amount = Annotated[Decimal, PlainSerializer(float, return_type=float, when_used="json")]
OptionalAmount = Annotated[
    Decimal | None,
    PlainSerializer(lambda v: None if v is None else float(v), return_type=float | None, when_used="json"),
]
