"""`python -m timekeeper`: the served app's heap is frozen once start-up is done, and the youngest
generation is collected less often (timekeeper.__main__.frozen_after_startup; docs/performance.md)."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from fastapi import FastAPI

import timekeeper.__main__ as serving
from timekeeper.settings import Settings


@pytest.fixture
def collector() -> Iterator[None]:
    """The test process's collector as it was, afterwards."""
    thresholds = gc.get_threshold()
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)


async def test_the_heap_is_frozen_after_start_up_not_before(collector: None) -> None:
    seen: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[dict[str, str]]:
        seen["frozen during start-up"] = gc.get_freeze_count()
        seen["made during start-up"] = made = [object()]  # in a container the collector tracks
        yield {"state": "kept"}
        seen["shut down"] = made

    async with serving.frozen_after_startup(lifespan)(None) as state:
        assert state == {"state": "kept"}
        assert seen["frozen during start-up"] == 0
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold()[0] == serving.YOUNG_GC_THRESHOLD
        assert not any(made is seen["made during start-up"] for made in gc.get_objects())
    assert "shut down" in seen


async def test_the_served_app_freezes_its_heap_after_its_own_lifespan(
    collector: None, monkeypatch: pytest.MonkeyPatch, settings: Settings
) -> None:
    started: list[int] = []

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        started.append(gc.get_freeze_count())
        yield

    monkeypatch.setattr(serving, "get_settings", lambda: settings)
    monkeypatch.setattr(serving, "configure_logging", lambda *_: None)
    monkeypatch.setattr(serving, "create_app", lambda _settings: FastAPI(lifespan=lifespan))
    app = serving.serving_app()
    async with app.router.lifespan_context(app):
        assert started == [0]
        assert gc.get_freeze_count() > 0
