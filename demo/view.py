"""What the demo shows: a live terminal view (a table per namespace and an event log, redrawn twice a
second) when stdout is a terminal, plain lines as things happen otherwise (logs, CI, the test)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from demo.pods import Admitted
from gpuaccounting.clock import WallClock

STATE_STYLE = {"in_budget": "green", "warning": "yellow", "exhausted": "bold red", "unlimited": "cyan"}
EVENT_LOG_LINES = 10


def minutes(value: Any) -> str:
    """GPU-minutes as the table shows them (whole minutes: budgets are a month's); None is unlimited."""
    return "unlimited" if value is None else f"{float(value):,.0f}"


def outlook(status: dict[str, Any]) -> str | None:
    """The forecast in words: the burn rate and when, at that rate, the budget runs out (None before
    anything burns, and once it has run out: the state says so)."""
    forecast = status.get("forecast")
    if not forecast or status["state"] == "exhausted" or not forecast["burn_rate_gpu_minutes_per_hour"]:
        return None
    rate = f"burning {minutes(forecast['burn_rate_gpu_minutes_per_hour'])} GPU-min/h"
    if forecast["exhausts_at"] is None:
        return f"{rate}, lasts the period" if status["budget_gpu_minutes"] is not None else rate
    at = datetime.fromisoformat(forecast["exhausts_at"].replace("Z", "+00:00"))
    return f"{rate}, runs out {at:%a %d %b %H:%M}"


@dataclass
class Board:
    """Everything on screen: the timekeeper's latest status per namespace and the pods created so far."""

    started: float = field(default_factory=time.monotonic)
    status: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, list[Admitted]] = field(default_factory=dict)
    # The timekeeper's clock, once it runs: events show the simulated time beside the real seconds.
    clock: WallClock | None = None

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def stamp(self) -> str:
        """`  5.3s` before the clock starts, `  5.3s | Tue 03 Mar 05:02` after."""
        real = f"{self.elapsed():5.1f}s"
        return real if self.clock is None else f"{real} | {self.clock.now():%a %d %b %H:%M}"

    def add_pod(self, admitted: Admitted) -> None:
        self.pods.setdefault(admitted.spec.namespace, []).append(admitted)


def namespace_table(name: str, status: dict[str, Any] | None, pods: list[Admitted]) -> Table:
    state = status["state"] if status else "unknown"
    title = Text(f"{name}  ", style="bold")
    if status:
        period = status["period"]["kind"]
        title.append(
            f"{period} budget {minutes(status['budget_gpu_minutes'])}"
            f" + granted {minutes(status['granted_gpu_minutes'])}"
            f" | used {minutes(status['used_gpu_minutes'])}"
            f" | remaining {minutes(status['remaining_gpu_minutes'])} GPU-min"
        )
        forecast = outlook(status)
        title.append(f" | {forecast}  " if forecast else "  ")
    title.append(state.upper(), style=STATE_STYLE.get(state, ""))
    table = Table(title=title, title_justify="left", expand=True, box=box.SIMPLE_HEAD)
    table.add_column("pod")
    table.add_column("sharing system")
    table.add_column("GPU share", justify="right")
    table.add_column("priority class")
    table.add_column("decision")
    for admitted in pods:
        table.add_row(
            admitted.spec.name,
            admitted.spec.system,
            admitted.share,
            Text(admitted.priority_class, style="bold red" if admitted.over_budget else "green"),
            admitted.decision,
        )
    return table


def board_tables(board: Board) -> list[Table]:
    names = sorted(set(board.status) | set(board.pods))
    return [namespace_table(name, board.status.get(name), board.pods.get(name, [])) for name in names]


def print_lines(console: Console, lines: list[str]) -> None:
    """Unwrapped, so the commands among them can be copied whole."""
    for line in lines:
        console.print(line, markup=False, highlight=False, soft_wrap=True)


class View(Protocol):
    def event(self, board: Board, text: str, style: str = "") -> None: ...

    def refresh(self, board: Board) -> None: ...

    def summary(self, board: Board, lines: list[str]) -> None: ...

    def resume(self, board: Board) -> None: ...

    def close(self) -> None: ...


class PlainView:
    """One line per event, prefixed with the seconds since the start; the tables once, in the summary."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def event(self, board: Board, text: str, style: str = "") -> None:
        self.console.print(f"[{board.stamp()}] {text}", markup=False, highlight=False, soft_wrap=True)

    def refresh(self, board: Board) -> None:
        return None

    def summary(self, board: Board, lines: list[str]) -> None:
        self.console.print()
        for table in board_tables(board):
            self.console.print(table)
        print_lines(self.console, lines)

    def resume(self, board: Board) -> None:
        return None

    def close(self) -> None:
        return None


class LiveView:
    """The tables and the latest events, redrawn in place."""

    def __init__(self, console: Console, header: str) -> None:
        self.console = console
        self.header = header
        self.events: deque[Text] = deque(maxlen=EVENT_LOG_LINES)
        self.live = Live(console=console, refresh_per_second=4, transient=False)
        self.live.start()

    def _render(self, board: Board) -> Group:
        log = Text("\n").join(self.events) if self.events else Text("...")
        heading = Text(f"{self.header}   t = {board.elapsed():.1f} s", style="bold")
        if board.clock is not None:
            heading.append(f"   simulated {board.clock.now():%a %d %b %Y %H:%M} UTC (a day per second)")
        return Group(heading, *board_tables(board), Panel(log, title="events", title_align="left"))

    def event(self, board: Board, text: str, style: str = "") -> None:
        self.events.append(Text(f"[{board.stamp()}] {text}", style=style))
        self.refresh(board)

    def refresh(self, board: Board) -> None:
        self.live.update(self._render(board))

    def summary(self, board: Board, lines: list[str]) -> None:
        """The last frame stays on screen; the summary goes below it."""
        self.refresh(board)
        self.live.stop()
        print_lines(self.console, lines)

    def resume(self, board: Board) -> None:
        """--serve: a fresh live view below the summary, until Ctrl-C."""
        self.live = Live(self._render(board), console=self.console, refresh_per_second=4)
        self.live.start()

    def close(self) -> None:
        self.live.stop()
