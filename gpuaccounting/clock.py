"""The time of every process that stamps or judges report intervals: the system clock, or an accelerated one
(`start + (time.time() - real_origin) * speed`, the same three numbers in every process, so all read the
same simulated time at the same real instant; docs/demo.md). Integer microseconds throughout."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MICROSECOND = timedelta(microseconds=1)


def to_datetime(microseconds: int) -> datetime:
    """Microseconds since the Unix epoch as an aware UTC datetime."""
    return EPOCH + timedelta(microseconds=microseconds)


def from_datetime(moment: datetime) -> int:
    """An aware datetime as integer microseconds since the Unix epoch (exact, unlike a float timestamp)."""
    return (moment - EPOCH) // _ONE_MICROSECOND


class SystemClock:
    """The real wall clock."""

    speed = 1.0

    def now_us(self) -> int:
        return time.time_ns() // 1000

    def now(self) -> datetime:
        return to_datetime(self.now_us())

    def real_seconds(self, simulated_seconds: float) -> float:
        """How long to wait in real time for `simulated_seconds` to pass."""
        return simulated_seconds


class AcceleratedClock:
    """start + (real time - real_origin) * speed; `real_time_ns` is time.time_ns unless a test drives it."""

    def __init__(
        self,
        start: datetime,
        speed: float,
        real_origin: float,
        real_time_ns: Callable[[], int] | None = None,
    ) -> None:
        if start.tzinfo is None:
            raise ValueError("the clock start must carry a timezone")
        if not (math.isfinite(speed) and speed > 0):
            raise ValueError("the clock speed must be a finite number greater than 0")
        if not math.isfinite(real_origin):
            raise ValueError("the clock origin must be a finite Unix time")
        self.start = start.astimezone(UTC)
        self.speed = speed
        self.real_origin = real_origin
        self._start_us = from_datetime(self.start)
        # To the microsecond: a float Unix time holds that exactly, not nanoseconds.
        self._origin_ns = round(real_origin * 1_000_000) * 1000
        self._real_time_ns = real_time_ns or time.time_ns

    def now_us(self) -> int:
        return self._start_us + round((self._real_time_ns() - self._origin_ns) * self.speed / 1000)

    def now(self) -> datetime:
        return to_datetime(self.now_us())

    def real_seconds(self, simulated_seconds: float) -> float:
        """How long to wait in real time for `simulated_seconds` to pass."""
        return simulated_seconds / self.speed


WallClock = SystemClock | AcceleratedClock


def build_clock(start: datetime | None, speed: float, real_origin: float | None, prefix: str) -> WallClock:
    """The clock a process's settings describe; `prefix` (e.g. "SIDECAR_") names the variables in errors. No
    start: the system clock (a speed other than 1 is a mistake); a start needs its origin, or clocks
    disagree."""
    if start is None:
        if speed != 1:
            raise ValueError(f"{prefix}CLOCK_SPEED needs {prefix}CLOCK_START")
        if real_origin is not None:
            raise ValueError(f"{prefix}CLOCK_ORIGIN needs {prefix}CLOCK_START")
        return SystemClock()
    if real_origin is None:
        raise ValueError(
            f"{prefix}CLOCK_ORIGIN is required with {prefix}CLOCK_START: the real Unix time (seconds) at "
            "which the clock reads CLOCK_START, the same for every process that must agree"
        )
    return AcceleratedClock(start, speed, real_origin)
