"""`python -m demo` run to completion as a newcomer runs it (real processes, embedded PostgreSQL), read
from its plain output: the story happened in order, and nothing was left behind."""

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


def test_the_budget_runs_out_the_next_pod_is_demoted_and_a_grant_restores_it(lines: list[str]) -> None:
    story = [
        r"vision: in_budget -> warning",
        r"vision: warning -> exhausted",
        r"admitted vision/eval-1 .* priority class gpu-over-budget \(namespace exhausted\)",
        r"admin grant: vision \+1\.00 GPU-min",
        r"vision: exhausted -> in_budget",
        r"admitted vision/eval-2 .* priority class gpu-in-budget \(namespace in_budget\)",
        r"^Summary: .*vision in_budget",
    ]
    positions = [first(lines, pattern) for pattern in story]
    assert positions == sorted(positions), list(zip(story, positions, strict=True))


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


def test_it_ends_with_the_commands_to_explore(lines: list[str]) -> None:
    docs = lines[first(lines, r"API docs: ")]
    assert re.search(r"http://127\.0\.0\.1:\d+/docs$", docs), docs
    token = lines[first(lines, r"export TOKEN=")]
    assert re.search(r"export TOKEN=\S{20,}$", token), token
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
