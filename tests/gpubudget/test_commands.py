"""Every command against a real timekeeper: the table a person reads, and `-o json` / `-o yaml` being
exactly what the API answered."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpubudget.commands import main
from tests.gpubudget.conftest import Cli

pytestmark = pytest.mark.e2e


def still(answer: Any) -> Any:
    """An answer without what moves while the test runs: the forecast's exhaustion is `now` plus what
    remains at the burn rate, and the clock is real."""
    if isinstance(answer, list):
        return [still(item) for item in answer]
    if isinstance(answer, dict):
        return {
            key: "(moves)" if key == "exhausts_at" and value else still(value)
            for key, value in answer.items()
        }
    return answer


def lines_of(out: str) -> dict[str, str]:
    """A table's rows by their first cell."""
    return {line.split()[0]: line for line in out.splitlines()[1:] if line.strip()}


def test_status_lists_every_namespace_with_state_usage_and_forecast(cli: Cli) -> None:
    out = cli.ok("status")

    header, *_ = out.splitlines()
    assert header.split() == [
        "NAMESPACE",
        "STATE",
        "BUDGET",
        "USED",
        "REMAINING",
        "PERIOD",
        "BURN/H",
        "EXHAUSTS",
    ]
    rows = lines_of(out)
    # 30 minutes of a GPU and 20 of half a GPU: 40 GPU-minutes used, 960 left, 6.67 an hour over 6 hours.
    assert rows["cli-train"].split()[:7] == [
        "cli-train",
        "in_budget",
        "1,000",
        "40",
        "960",
        "monthly",
        "6.67",
    ]
    assert "(in " in rows["cli-train"]
    assert rows["cli-free"].split()[:4] == ["cli-free", "unlimited", "unlimited", "10"]
    assert rows["cli-idle"].split()[-1] == "-"  # no burn: no exhaustion


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_status_as_json_or_yaml_is_the_apis_own_answer(cli: Cli, output: str) -> None:
    listed = yaml.safe_load(cli.ok("status", "-o", output))  # YAML reads JSON too
    one = yaml.safe_load(cli.ok("status", "cli-train", "-o", output))

    assert still(listed) == still(cli.api("/namespaces"))
    assert still(one) == still(cli.api("/namespaces/cli-train/budget"))
    assert one["forecast"]["window_minutes"] == 360


def test_status_of_one_namespace_reads_as_a_card(cli: Cli) -> None:
    out = cli.ok("status", "cli-train", token="reader")

    assert "state:" in out and "in_budget" in out
    assert "remaining:" in out and "960" in out
    assert "GPU-minutes/hour over the last 6h 0m" in out


@pytest.mark.parametrize("by", ["pod", "workload", "hour", "day"])
def test_usage_by_pod_workload_hour_or_day_adds_up_to_the_namespaces_use(cli: Cli, by: str) -> None:
    answer = cli.json("usage", "cli-train", "--by", by)
    out = cli.ok("usage", "cli-train", "--by", by)

    assert answer == cli.api("/namespaces/cli-train/usage", group_by=by, until=answer["until"])
    assert answer["total_gpu_minutes"] == 40
    assert out.splitlines()[1].split()[0] == by.upper()
    assert lines_of(out.split("\n", 1)[1])["TOTAL"].split()[1] == "40"
    if by == "pod":
        rows = lines_of(out.split("\n", 1)[1])
        assert (rows["trainer"].split()[1], rows["notebook"].split()[1]) == ("30", "10")
    if by == "workload":  # no pod watch here: each pod is its own workload
        rows = lines_of(out.split("\n", 1)[1])
        assert (rows["Pod/trainer"].split()[1], rows["Pod/notebook"].split()[1]) == ("30", "10")


def test_usage_takes_a_window(cli: Cli) -> None:
    answer = cli.json(
        "usage", "cli-train", "--since", "2000-01-01T00:00:00Z", "--until", "2000-01-02T00:00:00Z"
    )

    assert (answer["total_gpu_minutes"], answer["rows"]) == (0, [])


def test_top_ranks_namespaces_by_burn_rate_or_by_use(cli: Cli) -> None:
    by_burn = cli.json("top")
    out = cli.ok("top", "--sort", "remaining", "--limit", "2")

    assert [s["namespace"] for s in by_burn][:2] == ["cli-train", "cli-free"]
    assert (
        by_burn[0]["forecast"]["burn_rate_gpu_minutes_per_hour"]
        > by_burn[1]["forecast"]["burn_rate_gpu_minutes_per_hour"]
    )
    assert len(out.splitlines()) == 3  # header and two rows
    assert out.splitlines()[0].split()[:3] == ["NAMESPACE", "BURN/H", "USED"]


def test_forecast_shows_the_burn_rate_and_when_the_budget_runs_out(cli: Cli) -> None:
    one = cli.json("forecast", "cli-train")
    every = yaml.safe_load(cli.ok("forecast", "-o", "yaml"))
    out = cli.ok("forecast")

    assert still(one["forecast"]) == still(cli.api("/namespaces/cli-train/budget")["forecast"])
    assert one["forecast"]["exhausts_at"] is not None
    assert {entry["namespace"] for entry in every} >= {"cli-train", "cli-free", "cli-idle"}
    assert out.splitlines()[0] == "burn rate over the last 6h 0m"
    assert lines_of(out.split("\n", 1)[1])["cli-free"].split()[-1] == "-"  # unlimited: never runs out


def test_set_changes_only_what_it_is_given(cli: Cli) -> None:
    first = cli.json("set", "cli-set", "--budget", "500", "--period", "weekly", "--warn-at", "0.5")
    second = cli.json("set", "cli-set", "--budget", "700")
    out = cli.ok("set", "cli-set", "--max-gpu-share-per-pod", "2")

    assert (first["budget_gpu_minutes"], first["period"]["kind"], first["warn_at_fraction"]) == (
        500,
        "weekly",
        0.5,
    )
    assert (second["budget_gpu_minutes"], second["period"]["kind"], second["warn_at_fraction"]) == (
        700,
        "weekly",
        0.5,
    )
    assert "700 (own)" in out
    assert cli.api("/namespaces/cli-set/budget")["max_gpu_share_per_pod"] == 2
    assert cli.json("set", "cli-set", "--budget", "unlimited")["state"] == "unlimited"


def test_reset_returns_a_namespace_to_the_default(cli: Cli) -> None:
    cli.ok("set", "cli-reset", "--budget", "5")

    answer = cli.json("reset", "cli-reset")

    assert answer["source"] == "default"


def test_grant_adds_to_what_remains_and_moves_the_forecast(cli: Cli) -> None:
    cli.ok("set", "cli-grant", "--budget", "100")
    before = cli.api("/namespaces/cli-grant/budget")

    out = cli.ok("grant", "cli-grant", "60", "--reason", "paper deadline")
    answer = cli.json("grant", "cli-grant", "15.5", "--reason", "again")

    assert "60 GPU-minutes to cli-grant" in out and "paper deadline" in out
    assert answer["budget"]["remaining_gpu_minutes"] == before["remaining_gpu_minutes"] + 75.5
    assert answer["gpu_minutes"] == 15.5


def test_defaults_shows_and_changes_the_cluster_wide_default(cli: Cli) -> None:
    shown = cli.json("defaults")
    out = cli.ok("defaults")

    assert shown == cli.api("/defaults")
    assert "budget:" in out and "period:" in out
    changed = yaml.safe_load(cli.ok("defaults", "--budget", "12345", "-o", "yaml"))
    assert (changed["budget_gpu_minutes"], changed["period"]) == (12345, shown["period"])
    cli.ok(
        "defaults",
        "--budget",
        "unlimited" if shown["budget_gpu_minutes"] is None else str(shown["budget_gpu_minutes"]),
    )


def test_audit_shows_who_changed_what(cli: Cli) -> None:
    cli.ok("set", "cli-audit", "--budget", "10")
    cli.ok("set", "cli-audit", "--budget", "20")

    entries = cli.json("audit", "--namespace", "cli-audit")
    out = cli.ok("audit", "-n", "cli-audit", "--limit", "1")

    assert entries == cli.api("/audit", namespace="cli-audit")
    assert [entry["action"] for entry in entries] == ["budget.put", "budget.put"]
    [row] = out.splitlines()[1:]
    assert "budget.put" in row and "budget_gpu_minutes: 10 -> 20" in row


def test_connection_options_may_come_after_the_command(cli: Cli) -> None:
    code = main(["status", "cli-idle", "--url", cli.url, "--token", cli.tokens.reader, "-o", "json"])

    assert code == 0
    assert json.loads(cli.capsys.readouterr().out)["namespace"] == "cli-idle"


def test_a_token_that_begins_with_a_dash_is_a_token_not_an_option(cli: Cli) -> None:
    code, _, err = cli.run("status", "cli-idle", token="-" + cli.tokens.reader[1:])

    assert code == 1, err
    assert "401" in err or "token" in err.lower()


def test_the_environment_names_the_timekeeper_and_the_token(
    cli: Cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPU_BUDGET_URL", cli.url)
    (tmp_path / "token").write_text(cli.tokens.reader + "\n")
    monkeypatch.setenv("GPU_BUDGET_TOKEN_FILE", str(tmp_path / "token"))

    assert main(["status", "cli-idle", "-o", "json"]) == 0
    assert json.loads(cli.capsys.readouterr().out)["namespace"] == "cli-idle"
