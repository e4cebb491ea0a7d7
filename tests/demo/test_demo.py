"""`python -m demo` run to completion as a newcomer runs it (real processes, embedded PostgreSQL), read
from its plain output: the story happened in order on the compressed clock, with a month's budgets, and
nothing was left behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.support.postgres import REPO_ROOT

pytestmark = pytest.mark.e2e

DEMO_TIMEOUT_SECONDS = 150


@pytest.fixture(scope="module")
def demo_run() -> subprocess.CompletedProcess[str]:
    """One run for every check; stdout is a pipe, so the demo prints plain lines."""
    return subprocess.run(
        [sys.executable, "-m", "demo"],
        cwd=REPO_ROOT,
        env={**os.environ, "COLUMNS": "200"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_SECONDS,
        check=False,
    )


@pytest.fixture(scope="module")
def lines(demo_run: subprocess.CompletedProcess[str]) -> list[str]:
    assert demo_run.returncode == 0, demo_run.stdout + demo_run.stderr
    return demo_run.stdout.splitlines()


def first(lines: list[str], pattern: str) -> int:
    """Index of the first line matching `pattern`; fails naming the pattern when there is none."""
    for index, line in enumerate(lines):
        if re.search(pattern, line):
            return index
    raise AssertionError(f"no line matches {pattern!r} in:\n" + "\n".join(lines))


def test_the_budget_runs_out_the_next_pod_is_demoted_a_grant_restores_it_and_the_month_rolls_over(
    lines: list[str],
) -> None:
    story = [
        r"vision: in_budget -> warning",
        r"vision: warning -> exhausted",
        r"admitted vision/eval-1 .* priority class gpu-over-budget \(exhausted: ",
        r"admin grant: vision \+15,000 GPU-min",
        r"vision: exhausted -> in_budget",
        r"admitted vision/eval-2 .* priority class gpu-in-budget \(in-budget: ",
        r"new budget period 2026-04-01 \(monthly\): .*vision",
        r"^Summary: .*vision in_budget",
    ]
    positions = [first(lines, pattern) for pattern in story]
    assert positions == sorted(positions), list(zip(story, positions, strict=True))
    # The new month brings vision back in budget, and its grant (for March only) is gone.
    rollover = first(lines, r"new budget period")
    first(lines[rollover:], r"vision: (warning|exhausted) -> in_budget \(used [\d,]+ of 15,000 \+ 0 granted")


STAMP = re.compile(r"^\[\s*[\d.]+s \| \w{3} (\d{2}) (\w{3}) (\d{2}):(\d{2})\]")


def simulated_day(line: str) -> tuple[str, float]:
    """The month and fractional day of the simulated time an event line is stamped with."""
    found = STAMP.search(line)
    assert found is not None, line
    day, month, hour, minute = found.groups()
    return month, int(day) + int(hour) / 24 + int(minute) / 1440


def test_budgets_are_a_months_gpu_minutes_spent_over_simulated_days(lines: list[str]) -> None:
    budgets = lines[first(lines, r"budgets set: ")]
    assert "vision 15,000 GPU-min/monthly" in budgets and "nlp 50,000 GPU-min/monthly" in budgets, budgets
    exhausted = lines[first(lines, r"vision: warning -> exhausted")]
    used = re.search(r"\(used ([\d,]+) of 15,000 \+ 0 granted GPU-min\)", exhausted)
    assert used is not None and int(used.group(1).replace(",", "")) >= 15_000, exhausted
    # 1.5 GPUs spend 15,000 GPU-minutes in 6.9 days of the simulated March (a little more: the sidecars
    # start, report and are read a few simulated hours late)...
    first_pod = lines[first(lines, r"admitted vision/train-resnet ")]
    month, started_on = simulated_day(first_pod)
    exhausted_month, exhausted_on = simulated_day(exhausted)
    assert month == exhausted_month == "Mar"
    assert 6.5 <= exhausted_on - started_on <= 11, (first_pod, exhausted)
    # ...and the timekeeper, on the same clock, starts April's period on the first.
    assert simulated_day(lines[first(lines, r"new budget period")])[0] == "Apr"
    first(lines, r"^vision\s+monthly budget 15,000 \+ granted 0 \| used [\d,]+ \|")


def test_pods_of_every_sharing_system_are_admitted_in_budget_with_their_share(lines: list[str]) -> None:
    admitted = {
        "vision/train-resnet": "1",
        "vision/augment": "0.5",
        "nlp/finetune-llm": "0.428571",
        "nlp/tokenizer": "0.25",
        "research/notebook": "0.5",
        "research/simulate": "0.3",
    }
    for pod, share in admitted.items():
        line = lines[first(lines, rf"admitted {pod} ")]
        assert f"GPU share {share}, priority class gpu-in-budget" in line, line


def test_invalid_fractional_requests_are_denied_with_a_message_naming_the_rule(lines: list[str]) -> None:
    clearml = lines[first(lines, r"denied nlp/odd-fraction")]
    assert "clearml-injector/fraction=0.3" in clearml and "(rule clearml-fraction)" in clearml
    vcuda = lines[first(lines, r"denied research/too-much-core")]
    assert "tencent.com/vcuda-core=150" in vcuda and "(rule vcuda-core-range)" in vcuda
    cap = lines[first(lines, r"denied nlp/two-gpus")]
    assert "per-pod cap" in cap and "(rule namespace-cap)" in cap
    assert not any(re.search(r"admitted \S+/(odd-fraction|too-much-core|two-gpus)", line) for line in lines)


def test_the_forecast_says_when_the_budget_runs_out_and_how_the_grant_moves_it(lines: list[str]) -> None:
    warning = lines[first(lines, r"vision: in_budget -> warning")]
    forecast = re.search(
        r"forecast: burning ([\d,]+) GPU-min/h, runs out \w{3} (\d{2}) (\w{3}) (\d{2}):(\d{2})", warning
    )
    assert forecast is not None, warning
    # Warned at 80 % of the budget, vision is forecast to run out later in the same month. (How much later
    # depends on how late the sidecars' reports land: on a quiet machine it is the day it does run out;
    # on a busy one, reports a few real seconds late are simulated days late, and the rate reads lower.)
    rate, day, month, hour, minute = forecast.groups()
    warned_month, warned_on = simulated_day(warning)
    assert int(rate.replace(",", "")) > 0
    assert month == warned_month and int(day) + int(hour) / 24 + int(minute) / 1440 > warned_on, warning
    # After the grant: in budget again, with the forecast from the new remainder.
    restored = lines[first(lines, r"vision: exhausted -> in_budget")]
    assert re.search(
        r"; forecast: burning [\d,]+ GPU-min/h, (runs out \w{3} \d{2} \w{3}|lasts the period)", restored
    )


def test_it_ends_with_the_commands_to_explore(lines: list[str]) -> None:
    docs = lines[first(lines, r"API docs: ")]
    assert re.search(r"http://127\.0\.0\.1:\d+/docs$", docs), docs
    token = lines[first(lines, r"export TOKEN=")]
    assert re.search(r"export TOKEN=\S{20,}$", token), token
    dashboard = lines[first(lines, r"^  dashboard: ")]
    assert re.search(r"http://127\.0\.0\.1:\d+/ui ", dashboard), dashboard
    cli = lines[first(lines, r"^  CLI: ")]
    assert "GPU_BUDGET_URL=http://127.0.0.1:" in cli and "/gpu-budget forecast" in cli, cli
    first(lines, r"curl -s -H \"Authorization: Bearer \$TOKEN\" http://127\.0\.0\.1:\d+/api/v1/namespaces$")


def test_it_leaves_no_process_and_no_folder_behind(lines: list[str]) -> None:
    found = re.search(r"working folder (\S+)", lines[first(lines, r"working folder ")])
    assert found is not None
    workdir = found.group(1)
    assert not Path(workdir).exists()
    assert [process.pid for process in psutil.process_iter() if mentions(process, workdir)] == []


def mentions(process: psutil.Process, text: str) -> bool:
    """Whether the process's command line or environment names `text` (PostgreSQL's has its data folder,
    the others' environments their files there)."""
    try:
        return any(text in part for part in process.cmdline()) or any(
            text in value for value in process.environ().values()
        )
    except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
