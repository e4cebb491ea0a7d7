"""The audit log as the API answers it."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, Field

NAMESPACE_KEY = (
    "the namespace key (`<cluster>/<namespace>` for a member cluster's); null: a change to what every "
    "namespace shares (the default, prices, weights)"
)


ACTOR_CLUSTER = (
    "the member cluster whose API server authenticated `actor`; null: the hub's own cluster (or the "
    "timekeeper itself)"
)


class AuditEntryOut(BaseModel):
    id: int
    at: datetime
    actor: str
    actor_cluster: Annotated[str | None, Field(description=ACTOR_CLUSTER)]
    action: str
    # A key, unlike the bare namespace (with `cluster` beside it) of other answers: the audit log is the
    # hub admins' record of what they changed, filtered by key (GET /audit?namespace=a/team-x).
    namespace: Annotated[str | None, Field(description=NAMESPACE_KEY)]
    old_value: Any
    new_value: Any
