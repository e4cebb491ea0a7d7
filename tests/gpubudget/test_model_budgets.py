"""`gpu-budget status` with budgets per GPU model (issue #41), against a stand-in timekeeper that answers
recorded v1 answers: each model's budget, used, remaining and state under the total; nothing new where a
budget has no models; `-o json` still exactly the answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from gpubudget.commands import main
from tests.support import model_budgets
from tests.support.loopback import LoopbackServer, send_json
from tests.support.model_budgets import A100, H100

ANSWERS = {
    "/api/v1/namespaces": model_budgets.namespaces(),
    "/api/v1/namespaces/team-a/budget": model_budgets.team_a(),
    "/api/v1/namespaces/team-b/budget": model_budgets.team_b(),
    "/api/v1/namespaces/team-c/budget": model_budgets.team_c(),
}


class _Recorded(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        answer = ANSWERS.get(self.path)
        send_json(self, 200 if answer is not None else 404, answer or {"detail": "not recorded"})

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    server = LoopbackServer(_Recorded).start()
    yield server.url
    server.stop()


def status(url: str, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(["status", *argv, "--url", url, "--token", "t"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_the_card_shows_each_model_under_the_total(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    out = status(url, capsys, "team-a")

    total, models = out.split("MODEL ", 1)
    assert "state:" in total and "in_budget" in total.split("state:", 1)[1].splitlines()[0]
    assert "model policy:" in total and "reduce" in total
    assert "unknown model:" in total and "2.50 used" in total
    header, *rows = ("MODEL " + models).strip().splitlines()
    assert header.split() == ["MODEL", "STATE", "BUDGET", "USED", "REMAINING", "EXHAUSTS"]
    by_model = {row.split()[0]: row.split() for row in rows}
    assert by_model[H100] == [H100, "exhausted", "10", "10", "0", "exhausted"]
    assert by_model[A100][:5] == [A100, "in_budget", "500", "120", "380"]
    assert " ".join(by_model[A100][5:]) == "2026-03-25 08:00 UTC"


@pytest.mark.parametrize("namespace", ["team-b", "team-c"])
def test_a_budget_without_models_shows_nothing_new(
    url: str, capsys: pytest.CaptureFixture[str], namespace: str
) -> None:
    out = status(url, capsys, namespace)

    assert "MODEL" not in out and "model policy" not in out and "unknown model" not in out


def test_the_list_shows_each_model_indented_under_its_namespace(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = status(url, capsys)

    lines = out.splitlines()
    firsts = [line.split()[0] for line in lines[1:]]
    assert firsts == ["team-a", A100, H100, "team-b", "team-c"]
    h100 = next(line for line in lines if H100 in line)
    assert h100.startswith(f"  {H100}")
    assert h100.split() == [H100, "exhausted", "10", "10", "0", "exhausted"]


@pytest.mark.parametrize("namespace", [None, "team-a"])
def test_json_is_still_the_answer_with_its_models(
    url: str, capsys: pytest.CaptureFixture[str], namespace: str | None
) -> None:
    out = status(url, capsys, *([namespace] if namespace else []), "-o", "json")

    path = "/api/v1/namespaces" + (f"/{namespace}/budget" if namespace else "")
    assert json.loads(out) == ANSWERS[path]
