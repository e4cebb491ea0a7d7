"""The sidecar's settings: typed parsing of what the webhook injects, with errors naming the variable."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpuaccounting.clock import AcceleratedClock, SystemClock
from sidecar.config import Config, ConfigError

CLOCK = {"SIDECAR_CLOCK_START": "2026-03-01T00:00:00Z", "SIDECAR_CLOCK_ORIGIN": "1800000000.5"}
BASE = {
    "POD_NAMESPACE": "team-a",
    "POD_NAME": "trainer-0",
    "POD_UID": "0b5e6f0e-1111-2222-3333-444455556666",
    "SIDECAR_GPU_SHARE": "0.25",
    "SIDECAR_TIMEKEEPER_URL": "http://timekeeper:8080/",
}


def test_minimal_environment_gets_documented_defaults() -> None:
    config = Config.from_env(BASE)

    assert config.gpu_share == 0.25
    assert config.timekeeper_url == "http://timekeeper:8080"
    assert config.report_interval_seconds == 30.0
    assert config.sample_interval_seconds == 1.0
    assert config.nvml_backend == "pynvml"
    assert config.token_file == Path("/var/run/secrets/gpu-timekeeper/token")
    assert config.podinfo_dir is None
    assert config.log_debug is False
    assert config.log_format == "auto"
    assert config.cluster is None


def test_every_setting_is_read_and_typed() -> None:
    config = Config.from_env(
        {
            **BASE,
            "SIDECAR_REPORT_INTERVAL_SECONDS": "15",
            "SIDECAR_SAMPLE_INTERVAL_SECONDS": "0.5",
            "SIDECAR_NVML_BACKEND": "FAKE",
            "SIDECAR_NVML_LIBRARY": "/opt/lib/libnvidia-ml.so.1",
            "SIDECAR_PODINFO_DIR": "/etc/podinfo",
            "SIDECAR_BUFFER_MAX_REPORTS": "10",
            "SIDECAR_LOG_DEBUG": "yes",
            "SIDECAR_CLUSTER": "eu-b",
            "NVIDIA_VISIBLE_DEVICES": "GPU-1234",
        }
    )

    assert config.report_interval_seconds == 15.0
    assert config.sample_interval_seconds == 0.5
    assert config.nvml_backend == "fake"
    assert config.nvml_library == Path("/opt/lib/libnvidia-ml.so.1")
    assert config.podinfo_dir == Path("/etc/podinfo")
    assert config.buffer_max_reports == 10
    assert config.log_debug is True
    assert config.visible_devices == "GPU-1234"
    assert config.cluster == "eu-b"


def test_the_clock_is_the_system_clock_unless_start_speed_and_origin_are_given() -> None:
    assert isinstance(Config.from_env(BASE).clock(), SystemClock)

    config = Config.from_env({**BASE, **CLOCK, "SIDECAR_CLOCK_SPEED": "86400"})

    clock = config.clock()
    assert isinstance(clock, AcceleratedClock)
    assert clock.start == datetime(2026, 3, 1, tzinfo=UTC)
    assert clock.speed == 86400.0
    assert clock.real_origin == 1_800_000_000.5
    assert clock.real_seconds(86400) == 1.0


def test_false_reads_as_false() -> None:
    assert Config.from_env({**BASE, "SIDECAR_LOG_DEBUG": "false"}).log_debug is False
    assert Config.from_env({**BASE, "SIDECAR_LOG_DEBUG": "0"}).log_debug is False


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"POD_UID": ""}, "POD_UID is required"),
        ({"SIDECAR_GPU_SHARE": "half"}, "SIDECAR_GPU_SHARE='half' is not a float"),
        ({"SIDECAR_GPU_SHARE": "0"}, "SIDECAR_GPU_SHARE is required and must be greater than 0"),
        ({"SIDECAR_GPU_SHARE": "nan"}, "SIDECAR_GPU_SHARE='nan' must be at least"),
        ({"SIDECAR_TIMEKEEPER_URL": "timekeeper:8080"}, "must start with http:// or https://"),
        ({"SIDECAR_REPORT_INTERVAL_SECONDS": "0"}, "SIDECAR_REPORT_INTERVAL_SECONDS must be greater than 0"),
        ({"SIDECAR_LOG_DEBUG": "maybe"}, "SIDECAR_LOG_DEBUG='maybe' is not a boolean"),
        ({"SIDECAR_NVML_BACKEND": "dcgm"}, "SIDECAR_NVML_BACKEND='dcgm' must be one of pynvml, fake"),
        ({"SIDECAR_CLUSTER": "EU/b"}, "SIDECAR_CLUSTER='EU/b' is not a member cluster's name"),
        ({"SIDECAR_BUFFER_MAX_REPORTS": "1"}, "SIDECAR_BUFFER_MAX_REPORTS='1' must be at least 2"),
        (
            {"SIDECAR_REPORT_INTERVAL_SECONDS": "60", "SIDECAR_MAX_REPORT_INTERVAL_SECONDS": "30"},
            "SIDECAR_MAX_REPORT_INTERVAL_SECONDS must not be below",
        ),
        (
            {"SIDECAR_RETRY_BASE_SECONDS": "10", "SIDECAR_RETRY_MAX_SECONDS": "5"},
            "SIDECAR_RETRY_MAX_SECONDS must not be below",
        ),
        ({"SIDECAR_CLOCK_SPEED": "abc", **CLOCK}, "SIDECAR_CLOCK_SPEED='abc' is not a float"),
        ({"SIDECAR_CLOCK_SPEED": "0", **CLOCK}, "SIDECAR_CLOCK_SPEED must be greater than 0"),
        ({"SIDECAR_CLOCK_SPEED": "inf", **CLOCK}, "SIDECAR_CLOCK_SPEED='inf' must be at least"),
        ({"SIDECAR_CLOCK_START": "1 March"}, "SIDECAR_CLOCK_START='1 March' is not an RFC 3339 time"),
        (
            {"SIDECAR_CLOCK_START": "2026-03-01T00:00:00"},
            "SIDECAR_CLOCK_START='2026-03-01T00:00:00' needs a timezone",
        ),
        (
            {"SIDECAR_CLOCK_START": "2026-03-01T00:00:00Z"},
            "SIDECAR_CLOCK_ORIGIN is required with SIDECAR_CLOCK_START",
        ),
        ({**CLOCK, "SIDECAR_CLOCK_ORIGIN": "soon"}, "SIDECAR_CLOCK_ORIGIN='soon' is not a float"),
        ({"SIDECAR_CLOCK_SPEED": "86400"}, "SIDECAR_CLOCK_SPEED needs SIDECAR_CLOCK_START"),
        ({"SIDECAR_CLOCK_ORIGIN": "1800000000"}, "SIDECAR_CLOCK_ORIGIN needs SIDECAR_CLOCK_START"),
    ],
)
def test_bad_settings_are_refused_naming_the_variable(changes: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace("?", r"\?")):
        Config.from_env({**BASE, **changes})
