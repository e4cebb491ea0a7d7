"""Where the timekeeper gets "now": the system clock, or the accelerated one the sidecars share for the demo
(both from gpuaccounting.clock, so their arithmetic is the same), or a test's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol

from gpuaccounting.clock import AcceleratedClock, SystemClock

__all__ = ["AcceleratedClock", "Clock", "ManualClock", "SystemClock"]


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware, in UTC."""
        ...


class ManualClock:
    """A clock that moves only when told to; tests and scripted demos drive time with it."""

    def __init__(self, start: datetime) -> None:
        self.current = start.astimezone(UTC)

    def now(self) -> datetime:
        return self.current

    def advance(self, delta: timedelta) -> None:
        self.current += delta

    def set(self, moment: datetime) -> None:
        self.current = moment.astimezone(UTC)
