"""A real timekeeper (`python -m timekeeper`, static tokens, its own migrated PostgreSQL database) for the
CLI's tests, seeded once through the API: budgets and reports ending now, so burn rates and forecasts
are real. "Now" is the timekeeper's clock, set to the middle of a month: on the system clock the tests
failed in a month's first half hour (part of the use fell in the month before) and its last six days
(the forecast's exhaustion, six days out, fell after the period's end and is not shown)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpubudget.commands import main
from tests.support.processes import LOCAL_HTTP, TimekeeperProcess, free_port
from tests.support.timekeeper import Tokens, bearer, migrated_database, report_body

MID_MONTH = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


@dataclass
class Cli:
    """`gpu-budget` in-process against the test timekeeper: answers (exit code, stdout, stderr)."""

    url: str
    tokens: Tokens
    capsys: pytest.CaptureFixture[str]

    def run(self, *args: str, token: str | None = "admin", url: str | None = None) -> tuple[int, str, str]:
        self.capsys.readouterr()
        connection = ["--url", url or self.url]
        if token is not None:
            connection += ["--token", getattr(self.tokens, token, token)]
        code = main([*connection, *args])
        captured = self.capsys.readouterr()
        return code, captured.out, captured.err

    def ok(self, *args: str, token: str | None = "admin") -> str:
        code, out, err = self.run(*args, token=token)
        assert code == 0, err
        return out

    def json(self, *args: str, token: str | None = "admin") -> Any:
        return json.loads(self.ok(*args, "-o", "json", token=token))

    def api(self, path: str, **params: Any) -> Any:
        """The API's own answer, for comparison."""
        response = LOCAL_HTTP.get(
            f"{self.url}/api/v1{path}", params=params, headers=bearer(self.tokens.admin), timeout=10
        )
        assert response.status_code == 200, response.text
        return response.json()


@dataclass
class Seeded:
    url: str
    tokens: Tokens
    process: TimekeeperProcess


def _send(url: str, token: str, method: str, path: str, body: dict[str, Any]) -> None:
    response = LOCAL_HTTP.request(method, f"{url}/api/v1{path}", json=body, headers=bearer(token), timeout=10)
    assert response.is_success, response.text


@pytest.fixture(scope="package")
def timekeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    """cli-train spends from a budget of 1,000 (two pods: 30 min of one GPU, 20 min of half a GPU, both
    ending now), cli-free has none (unlimited), cli-idle a budget and no use."""
    tokens = Tokens()
    folder: Path = tmp_path_factory.mktemp("cli-timekeeper")
    with migrated_database("gtk_cli") as database:
        origin = time.time()
        env = tokens.env() | {
            "TIMEKEEPER_CLOCK_START": MID_MONTH.isoformat(),
            "TIMEKEEPER_CLOCK_ORIGIN": f"{origin:.6f}",
        }
        process = TimekeeperProcess(database, env, free_port(), folder / "timekeeper.log")
        process.start()
        try:
            url = process.url
            _send(url, tokens.admin, "PUT", "/namespaces/cli-train/budget", {"budget_gpu_minutes": 1000})
            _send(url, tokens.admin, "PUT", "/namespaces/cli-free/budget", {"budget_gpu_minutes": None})
            _send(url, tokens.admin, "PUT", "/namespaces/cli-idle/budget", {"budget_gpu_minutes": 50})
            elapsed = timedelta(seconds=time.time() - origin)
            now = (MID_MONTH + elapsed).replace(microsecond=0) - timedelta(seconds=5)
            for namespace, pod, minutes, share in (
                ("cli-train", "trainer", 30, 1.0),
                ("cli-train", "notebook", 20, 0.5),
                ("cli-free", "batch", 10, 1.0),
            ):
                body = report_body(
                    namespace=namespace,
                    pod=pod,
                    pod_uid=f"uid-{pod}",
                    start=now - timedelta(minutes=minutes),
                    end=now,
                    gpu_share=share,
                )
                _send(url, tokens.reporter, "POST", "/reports", body)
            yield Seeded(url, tokens, process)
        finally:
            process.stop()


@pytest.fixture
def cli(timekeeper: Seeded, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Cli:
    for name in ("GPU_BUDGET_URL", "GPU_BUDGET_TOKEN", "GPU_BUDGET_TOKEN_FILE", "GPU_BUDGET_SERVICE"):
        monkeypatch.delenv(name, raising=False)
    return Cli(timekeeper.url, timekeeper.tokens, capsys)
