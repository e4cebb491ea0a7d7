"""Where the timekeeper gets "now": the system clock, or an accelerated one for the demo, or a test's."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Protocol


class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, timezone-aware, in UTC."""
        ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class AcceleratedClock:
    """Starts at `start` and runs `speed` times faster than real time: the demo lives a month in minutes."""

    def __init__(self, start: datetime, speed: float) -> None:
        self._start = start.astimezone(UTC)
        self._speed = speed
        self._origin = time.monotonic()

    def now(self) -> datetime:
        return self._start + timedelta(seconds=(time.monotonic() - self._origin) * self._speed)


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
