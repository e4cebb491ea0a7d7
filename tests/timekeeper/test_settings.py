"""Settings from TIMEKEEPER_* variables, typed; and the clock they choose."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from timekeeper import clock as clock_module
from timekeeper.app import default_clock
from timekeeper.clock import AcceleratedClock, SystemClock
from timekeeper.settings import Settings


def test_settings_are_read_from_prefixed_variables_with_types(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIMEKEEPER_DATABASE_URL", "postgresql://tk@db.example/tk")
    monkeypatch.setenv("TIMEKEEPER_ANONYMOUS_READ", "false")
    monkeypatch.setenv("TIMEKEEPER_CLOCK_SKEW", "90")
    monkeypatch.setenv("TIMEKEEPER_MAX_REPORT_INTERVAL", "PT10M")
    monkeypatch.setenv("TIMEKEEPER_OVER_BUDGET_PRIORITY_CLASS", "batch-low")

    settings = Settings()

    assert settings.database_url == "postgresql+psycopg://tk@db.example/tk"
    assert settings.anonymous_read is False
    assert settings.clock_skew == timedelta(seconds=90)
    assert settings.max_report_interval == timedelta(minutes=10)
    assert settings.over_budget_priority_class == "batch-low"


def test_the_system_clock_is_the_default() -> None:
    assert isinstance(default_clock(Settings(clock_start=None)), SystemClock)


def test_the_demo_clock_starts_where_told_and_runs_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    real = [1000.0]
    monkeypatch.setattr(clock_module.time, "monotonic", lambda: real[0])
    start = datetime(2026, 1, 1, tzinfo=UTC)

    demo = default_clock(Settings(clock_start=start, clock_speed=86_400))
    real[0] += 2.5

    assert isinstance(demo, AcceleratedClock)
    assert demo.now() == start + timedelta(days=2.5)
