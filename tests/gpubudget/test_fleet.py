"""`gpu-budget` against a fleet's hub (docs/fleet.md): the hub's listing holds `team-x` of the local cluster
and of member `a`, each answered as its bare namespace with its `cluster` beside it, and the CLI shows the
member's as `a/team-x` so the two rows are told apart. The member's budget is set under its namespace key
in process, before the served timekeeper starts on the same database: only the hub composes keys, from the
cluster that authenticated the caller, and static mode (the test's) has no members."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import URL

from gpubudget.commands import main
from tests.support.postgres import url_string
from tests.support.processes import TimekeeperProcess, free_port
from tests.support.timekeeper import Tokens, migrated_database
from timekeeper.app import create_app, run_context
from timekeeper.auth.base import Principal
from timekeeper.budgets.schemas import BudgetIn
from timekeeper.budgets.service import BudgetService
from timekeeper.clock import SystemClock
from timekeeper.settings import Settings


async def _budgets(database: URL, tokens: Tokens) -> None:
    """A budget of 100 for the local team-x, 200 for member a's, each set by an `admin` of its cluster."""
    settings = Settings(database_url=url_string(database), scheduler_enabled=False, **tokens.settings())
    app = create_app(settings)
    clock = SystemClock()
    async with run_context(app, settings, clock) as context, context.sessions() as session, session.begin():
        budgets = BudgetService(session, settings, clock)
        for key, amount, cluster in (("team-x", 100, None), ("a/team-x", 200, "a")):
            admin = Principal(name="admin", cluster=cluster)  # each namespace's own cluster's admin
            await budgets.put(key, BudgetIn(budget_gpu_minutes=amount), admin)


def clear_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "GPU_BUDGET_URL",
        "GPU_BUDGET_TOKEN",
        "GPU_BUDGET_TOKEN_FILE",
        "GPU_BUDGET_SERVICE",
        "GPU_BUDGET_CLUSTER",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Tokens]]:
    tokens = Tokens()
    with migrated_database("gtk_cli_fleet") as database:
        asyncio.run(_budgets(database, tokens))
        folder: Path = tmp_path_factory.mktemp("cli-fleet")
        process = TimekeeperProcess(database, tokens.env(), free_port(), folder / "timekeeper.log")
        process.start()
        try:
            yield process.url, tokens
        finally:
            process.stop()


def test_a_hubs_listing_names_each_namespaces_cluster(
    hub: tuple[str, Tokens], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_environment(monkeypatch)
    url, tokens = hub
    connection = ["--url", url, "--token", tokens.admin]

    assert main([*connection, "status"]) == 0
    rows = {line.split()[0]: line.split()[2] for line in capsys.readouterr().out.splitlines()[1:]}
    assert main([*connection, "status", "-o", "json"]) == 0
    answers = json.loads(capsys.readouterr().out)

    assert rows == {"team-x": "100", "a/team-x": "200"}
    assert sorted((s["cluster"], s["namespace"]) for s in answers if s["cluster"]) == [("a", "team-x")]
    assert [s["cluster"] for s in answers if s["budget_gpu_minutes"] == 100] == [None]


def test_the_audit_log_tells_the_hubs_admin_from_a_members(
    hub: tuple[str, Tokens], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    clear_environment(monkeypatch)
    url, tokens = hub

    assert main(["--url", url, "--token", tokens.admin, "audit"]) == 0
    rows = [row.split(" UTC ", 1)[1].split("budget.put") for row in capsys.readouterr().out.splitlines()[1:]]

    assert sorted((actor.strip(), rest.split()[0]) for actor, rest in rows) == [
        ("admin", "team-x"),
        ("admin (a)", "a/team-x"),
    ]


def test_the_cluster_is_sent_from_the_flag_or_the_environment(
    hub: tuple[str, Tokens], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hub reads the cluster from CLUSTER_HEADER: this one (static mode) has no members, so a cluster
    that reaches it is a 400 that names it, and one that does not is answered as the hub's own caller's."""
    clear_environment(monkeypatch)
    url, tokens = hub
    connection = ["--url", url, "--token", tokens.admin]

    assert main([*connection, "--cluster", "b", "status", "team-x"]) == 1
    flag = capsys.readouterr().err
    monkeypatch.setenv("GPU_BUDGET_CLUSTER", "c")
    assert main([*connection, "status", "team-x"]) == 1
    environment = capsys.readouterr().err
    assert main([*connection, "--cluster", "Not a label", "status", "team-x"]) == 2
    refused_here = capsys.readouterr().err
    monkeypatch.setenv("GPU_BUDGET_CLUSTER", "")
    assert main([*connection, "status", "team-x"]) == 0  # empty: the hub's own cluster

    assert "cluster 'b'" in flag and "not a member cluster" in flag
    assert "cluster 'c'" in environment and "not a member cluster" in environment
    assert "--cluster must be" in refused_here
