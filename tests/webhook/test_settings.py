"""Settings from the environment: typed, comma-separated lists, unknown rules refused."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
from pydantic import ValidationError

from webhook.settings import WebhookSettings


def test_environment_is_read_with_types(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hardware = tmp_path / "hardware.json"
    hardware.write_text('{"time_slicing_replicas": 4, "clearml_fractions": ["1/2", "0.25"]}')
    monkeypatch.setenv("WEBHOOK_DISABLED_RULES", "namespace-cap, vcuda-core-range")
    monkeypatch.setenv("WEBHOOK_WATCH_PRIORITY_CLASSES", "false")
    monkeypatch.setenv("WEBHOOK_HARDWARE_FILE", str(hardware))
    settings = WebhookSettings()
    assert settings.disabled_rules == {"namespace-cap", "vcuda-core-range"}
    assert settings.watch_priority_classes is False
    assert settings.hardware.clearml_fractions == {Fraction(1, 2), Fraction(1, 4)}
    assert settings.hardware.time_slicing_replicas == 4
    assert not settings.enforces("namespace-cap") and settings.enforces("single-system")


def test_a_broken_hardware_file_stops_the_webhook_at_start(tmp_path: Path) -> None:
    hardware = tmp_path / "hardware.json"
    hardware.write_text('{"gpu_memory_mib": "80Gi"}')
    with pytest.raises(ValidationError, match=r"hardware\.json: gpu_memory_mib must be a positive integer"):
        WebhookSettings(hardware_file=hardware)


def test_log_format_console_means_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEBHOOK_LOG_FORMAT", "console")
    assert WebhookSettings().log_format == "text"


def test_unknown_rule_is_refused() -> None:
    with pytest.raises(ValidationError, match="unknown rules"):
        WebhookSettings(disabled_rules="no-such-rule")


def test_the_share_floor_is_never_disabled() -> None:
    """A share below the floor would be written as 0 and charged nothing: it is lowered, not turned off."""
    with pytest.raises(ValidationError, match="lower the floor in the hardware file's minimum_shares"):
        WebhookSettings(disabled_rules="namespace-cap,minimum-share")


def test_default_sidecar_image_is_versioned() -> None:
    image = WebhookSettings().sidecar_image
    assert ":" in image and not image.endswith(":latest")


def test_the_cluster_is_read_and_must_be_a_members_name(monkeypatch: pytest.MonkeyPatch) -> None:
    assert WebhookSettings().cluster is None
    monkeypatch.setenv("WEBHOOK_CLUSTER", "")
    assert WebhookSettings().cluster is None
    monkeypatch.setenv("WEBHOOK_CLUSTER", "eu-train")
    assert WebhookSettings().cluster == "eu-train"
    for bad in ("EU", "a/b", "-a", "a" * 64):
        with pytest.raises(ValidationError, match="is not a member cluster's name"):
            WebhookSettings(cluster=bad)
