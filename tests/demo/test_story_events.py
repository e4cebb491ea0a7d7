"""The demo tells each budget-state transition once: a new period's exhausted -> in_budget is told from the
polls at the rollover, before the timekeeper has recorded it, and must not be told again when a later
transition brings the recorded events (which hold it once)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from demo.story import Story
from demo.view import Board


class Api:
    """The timekeeper's two reads the story polls, answered from the lists the test sets."""

    def __init__(self) -> None:
        self.statuses: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []

    def get(self, path: str, params: object = None) -> SimpleNamespace:
        body = self.statuses if path == "/namespaces" else self.events
        return SimpleNamespace(raise_for_status=lambda: None, json=lambda: body)


class Told:
    """A view that keeps the lines told."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def event(self, board: Board, text: str, style: str = "") -> None:
        self.lines.append(text)

    def refresh(self, board: Board) -> None:
        return None


def status(state: str, period_start: str) -> dict[str, Any]:
    return {
        "namespace": "vision",
        "state": state,
        "period": {"start": period_start, "kind": "monthly"},
        "used_gpu_minutes": 0,
        "budget_gpu_minutes": 15000,
        "granted_gpu_minutes": 0,
    }


def event(event_id: int, old: str | None, new: str) -> dict[str, Any]:
    return {"id": event_id, "old_state": old, "new_state": new}


def test_a_new_periods_transition_told_by_the_polls_is_not_told_again_from_the_events() -> None:
    api, view = Api(), Told()
    cluster = SimpleNamespace(
        api_client=lambda token: api,
        tokens=SimpleNamespace(admin="a", reader="r"),
        webhook_client=lambda: api,
    )
    story = Story(cast(Any, cluster), cast(Any, view), Board())
    api.events = [event(1, None, "in_budget"), event(2, "in_budget", "exhausted")]
    api.statuses = [status("exhausted", "2026-03-01")]
    story.poll()
    api.statuses = [status("in_budget", "2026-04-01")]  # the rollover, not yet among the events
    story.poll()
    api.events += [event(3, "exhausted", "in_budget"), event(4, "in_budget", "warning")]
    api.statuses = [status("warning", "2026-04-01")]
    story.poll()
    transitions = [line.split(" (")[0] for line in view.lines if line.startswith("vision: ")]
    assert transitions == ["vision: exhausted -> in_budget", "vision: in_budget -> warning"]
