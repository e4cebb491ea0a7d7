"""The one clock the timekeeper and the sidecars share: the system clock, or start + (real - origin) * speed
from three explicit numbers, so two processes agree at the same real instant whenever they started."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from gpuaccounting.clock import AcceleratedClock, SystemClock, build_clock, from_datetime, to_datetime

START = datetime(2026, 3, 1, tzinfo=UTC)
ORIGIN = 1_800_000_000.25  # a real Unix time, seconds
ORIGIN_NS = 1_800_000_000_250_000_000


class RealTime:
    """A stand-in for time.time_ns that moves only when told to."""

    def __init__(self, ns: int) -> None:
        self.ns = ns

    def __call__(self) -> int:
        return self.ns


def test_it_reads_start_at_the_origin_and_speed_simulated_seconds_per_real_second() -> None:
    real = RealTime(ORIGIN_NS)
    clock = AcceleratedClock(START, 86_400, ORIGIN, real)

    assert clock.now() == START
    real.ns += 1_500_000_000
    assert clock.now() == START + timedelta(days=1.5)
    assert clock.now_us() == from_datetime(START + timedelta(days=1.5))


def test_before_its_origin_it_reads_earlier_than_start() -> None:
    clock = AcceleratedClock(START, 3600, ORIGIN, RealTime(ORIGIN_NS - 2_000_000_000))

    assert clock.now() == START - timedelta(hours=2)


def test_two_clocks_built_at_different_moments_agree_at_the_same_real_instant() -> None:
    """What keeps a timekeeper and a sidecar started seconds apart (or restarted) on one timeline."""
    real = RealTime(ORIGIN_NS + 123_456_789)
    timekeeper = AcceleratedClock(START, 86_400, ORIGIN, real)
    real.ns += 7_777_777_777
    sidecar = AcceleratedClock(
        datetime(2026, 3, 1, 1, tzinfo=timezone(timedelta(hours=1))), 86_400, ORIGIN, real
    )

    assert sidecar.now_us() == timekeeper.now_us()
    assert timekeeper.now() == START + timedelta(seconds=(123_456_789 + 7_777_777_777) * 86_400 / 1e9)


def test_a_simulated_span_is_waited_for_in_real_time_divided_by_the_speed() -> None:
    assert AcceleratedClock(START, 3600, ORIGIN).real_seconds(7200) == 2.0
    assert SystemClock().real_seconds(7200) == 7200


def test_the_system_clock_reads_the_wall_clock() -> None:
    before = datetime.now(UTC)
    now = SystemClock().now()

    assert now.tzinfo is not None
    assert before - timedelta(seconds=1) <= now <= datetime.now(UTC)


def test_microseconds_and_datetimes_convert_exactly_both_ways() -> None:
    moment = datetime(2026, 3, 31, 23, 59, 59, 999_999, tzinfo=UTC)

    assert to_datetime(from_datetime(moment)) == moment
    assert from_datetime(to_datetime(1_772_323_200_000_001)) == 1_772_323_200_000_001


def test_settings_choose_the_system_clock_without_a_start_and_the_accelerated_one_with_all_three() -> None:
    assert isinstance(build_clock(None, 1.0, None, "X_"), SystemClock)
    accelerated = build_clock(START, 60.0, ORIGIN, "X_")
    assert isinstance(accelerated, AcceleratedClock)
    assert (accelerated.start, accelerated.speed, accelerated.real_origin) == (START, 60.0, ORIGIN)


@pytest.mark.parametrize(
    ("start", "speed", "origin", "message"),
    [
        (START, 60.0, None, "X_CLOCK_ORIGIN is required with X_CLOCK_START"),
        (None, 60.0, None, "X_CLOCK_SPEED needs X_CLOCK_START"),
        (None, 1.0, ORIGIN, "X_CLOCK_ORIGIN needs X_CLOCK_START"),
        (START, 0.0, ORIGIN, "speed must be a finite number greater than 0"),
        (START, float("inf"), ORIGIN, "speed must be a finite number greater than 0"),
        (START, 1.0, float("nan"), "origin must be a finite Unix time"),
        (datetime(2026, 3, 1), 1.0, ORIGIN, "must carry a timezone"),
    ],
)
def test_an_incomplete_or_impossible_clock_is_refused_naming_the_variable(
    start: datetime | None, speed: float, origin: float | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build_clock(start, speed, origin, "X_")
