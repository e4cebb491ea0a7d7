"""The audit log as the API answers it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel


class AuditEntryOut(BaseModel):
    id: int
    at: datetime
    actor: str
    action: str
    namespace: str | None
    old_value: Any
    new_value: Any
