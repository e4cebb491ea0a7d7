"""Settings from TIMEKEEPER_* variables, typed; and the clock they choose."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from gpuaccounting import clock
from timekeeper.app import default_clock
from timekeeper.clock import AcceleratedClock, SystemClock
from timekeeper.periodic.runner import PeriodicRunner
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


def test_the_demo_clock_reads_its_start_at_its_origin_then_runs_faster(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_ns = [1_800_000_000 * 10**9]
    monkeypatch.setattr(clock.time, "time_ns", lambda: real_ns[0])
    monkeypatch.setenv("TIMEKEEPER_CLOCK_START", "2026-01-01T00:00:00Z")
    monkeypatch.setenv("TIMEKEEPER_CLOCK_SPEED", "86400")
    monkeypatch.setenv("TIMEKEEPER_CLOCK_ORIGIN", "1800000000")

    demo = default_clock(Settings())
    real_ns[0] += 2_500_000_000

    assert isinstance(demo, AcceleratedClock)
    assert demo.now() == datetime(2026, 1, 1, tzinfo=UTC) + timedelta(days=2.5)


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"TIMEKEEPER_CLOCK_START": "2026-01-01T00:00:00Z"}, "TIMEKEEPER_CLOCK_ORIGIN is required"),
        ({"TIMEKEEPER_CLOCK_SPEED": "60"}, "TIMEKEEPER_CLOCK_SPEED needs TIMEKEEPER_CLOCK_START"),
        ({"TIMEKEEPER_CLOCK_ORIGIN": "1800000000"}, "TIMEKEEPER_CLOCK_ORIGIN needs TIMEKEEPER_CLOCK_START"),
        ({"TIMEKEEPER_CLOCK_SPEED": "fast"}, "clock_speed"),
        ({"TIMEKEEPER_CLOCK_START": "2026-01-01T00:00:00", "TIMEKEEPER_CLOCK_ORIGIN": "1"}, "timezone"),
    ],
)
def test_an_incomplete_demo_clock_is_refused_at_start(
    monkeypatch: pytest.MonkeyPatch, variables: dict[str, str], message: str
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)

    with pytest.raises(ValidationError, match=message):
        Settings()


def test_the_leader_check_timeout_is_two_retry_intervals_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    def election_timeout(settings: Settings) -> float:
        runner = PeriodicRunner("postgresql+psycopg://tk@db.example/tk", None, settings, SystemClock())  # type: ignore[arg-type]
        return runner.election.check_seconds

    assert election_timeout(Settings(leader_retry_interval=3)) == 6
    monkeypatch.setenv("TIMEKEEPER_LEADER_CHECK_TIMEOUT", "10")
    assert Settings().leader_check_timeout == timedelta(seconds=10)
    assert election_timeout(Settings(leader_retry_interval=3)) == 10
    monkeypatch.setenv("TIMEKEEPER_LEADER_CHECK_TIMEOUT", "0")
    with pytest.raises(ValidationError, match="must be positive"):
        Settings()


@pytest.mark.parametrize(
    "reader_tokens",
    [
        {"not-a-digest": ["team-a"]},
        {"a" * 64: []},
        {"a" * 64: ["Team_A"]},
        {"a" * 64: "team-a,team-b"},
    ],
)
def test_malformed_scoped_reader_tokens_stop_start_up(reader_tokens: object) -> None:
    with pytest.raises(ValidationError):
        Settings(reader_tokens=reader_tokens)


def test_a_digest_may_hold_one_role_only() -> None:
    digest = "b" * 64
    with pytest.raises(ValidationError, match="more than one role"):
        Settings(reader_token_sha256=digest, reader_tokens={digest: ["team-a"]})


def test_scoped_reader_tokens_read_from_the_environment_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIMEKEEPER_READER_TOKENS", '{"%s": ["team-b", "team-a"]}' % ("C" * 64))

    assert Settings().reader_tokens == {"c" * 64: ("team-a", "team-b")}


def test_scoped_reporter_tokens_read_as_json_and_hold_one_role(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIMEKEEPER_REPORTER_TOKENS", '{"%s": ["team-b", "team-a"]}' % ("D" * 64))

    assert Settings().reporter_tokens == {"d" * 64: ("team-a", "team-b")}
    with pytest.raises(ValidationError, match="more than one role"):
        Settings(reader_tokens={"d" * 64: ["team-a"]})
    with pytest.raises(ValidationError, match="at least one namespace"):
        Settings(reporter_tokens={"e" * 64: []})
