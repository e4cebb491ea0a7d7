"""The namespaces' state history as the API answers it."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from gpuaccounting.wire import BudgetState


class BudgetEventOut(BaseModel):
    """One transition of a namespace's budget state (old_state null: the namespace was first seen)."""

    id: int
    at: datetime
    old_state: BudgetState | None
    new_state: BudgetState
    model: str | None = None  # a GPU model's own budget changed state; null: the total's
