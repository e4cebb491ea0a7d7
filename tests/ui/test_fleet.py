"""The dashboard on a fleet's hub (FLEET.md rule 7): `team-x` of the local cluster and of members `a` and
`b` are three rows, each member's with its cluster before its name, and the list totals each cluster and
all of them. A member's use is charged under its namespace key by the timekeeper's own ingest batcher, in
process, before the served timekeeper starts on the same database: no report body can carry a key (the
hub composes it from the cluster that authenticated the sender)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from sqlalchemy.engine import URL

from tests.support.postgres import url_string
from tests.support.timekeeper import Tokens, migrated_database, report_body
from tests.ui.conftest import CHROMEDRIVER, CHROMIUM, NOW, WHY_SKIPPED, System, _serve, report_hours
from tests.ui.test_dashboard import absent, find, page_errors, sign_in, wait_for
from timekeeper.app import create_app, run_context
from timekeeper.clock import ManualClock
from timekeeper.domain.clusters import split_key
from timekeeper.settings import Settings
from timekeeper.usage.router import INGEST, keyed
from timekeeper.usage.schemas import ReportIn

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.browser,
    pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason=WHY_SKIPPED),
]

# Each member namespace's pod: (hours of use before NOW, GPU share).
MEMBERS = {"a/team-x": (2, 1.0), "b/team-x": (1, 0.5)}


async def _charge_members(database: URL, tokens: Tokens) -> None:
    settings = Settings(database_url=url_string(database), scheduler_enabled=False, **tokens.settings())
    app = create_app(settings)
    async with run_context(app, settings, ManualClock(NOW)) as context:
        for key, (hours, share) in MEMBERS.items():
            body = report_body(
                namespace=split_key(key)[1],
                pod="trainer-0",
                pod_uid="uid-trainer-0",
                start=NOW - timedelta(hours=hours + 1),
                minutes=60 * hours,
                gpu_share=share,
            )
            report = keyed(split_key(key)[0], ReportIn.model_validate(body))
            await context[INGEST].submit(report)


@pytest.fixture(scope="module")
def fleet_system(ui_tokens: Tokens, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    folder: Path = tmp_path_factory.mktemp("ui-fleet")
    with migrated_database("gtk_ui_fleet") as database:
        asyncio.run(_charge_members(database, ui_tokens))
        for started in _serve(database, "fleet", ui_tokens, folder):
            report_hours(started, "team-x", "trainer-0", [1], 1.0)  # the local cluster's, an hour
            yield started


def test_a_fleets_list_shows_each_namespaces_cluster_and_each_clusters_totals(
    browser: WebDriver, fleet_system: System
) -> None:
    sign_in(browser, fleet_system, fleet_system.tokens.reader)
    find(browser, "#namespaces [data-namespace]")

    rows = browser.execute_script(
        "return [...document.querySelectorAll('#namespaces [role=row][data-namespace]')]"
        ".map(tr => [tr.dataset.cluster, tr.querySelector('[role=rowheader]').textContent])"
    )
    assert rows == [["", "team-x"], ["a", "a / team-x"], ["b", "b / team-x"]]
    # The local namespace links to its page; a member's is shown, not linked.
    assert find(browser, '[data-cluster=""] [role=rowheader] a').get_attribute("href").endswith("#/ns/team-x")
    assert absent(browser, '[data-cluster="a"] [role=rowheader] a')
    totals = [item.text for item in browser.find_elements(By.CSS_SELECTOR, "#list-clusters li")]
    assert totals == [
        "local cluster 1 namespace, 60 GPU-minutes used",
        "a 1 namespace, 120 GPU-minutes used",
        "b 1 namespace, 30 GPU-minutes used",
        "All clusters 3 namespaces, 210 GPU-minutes used",
    ]

    find(browser, "#filter-name").send_keys("b/")
    wait_for(
        browser,
        lambda b: (
            b.execute_script(
                "return [...document.querySelectorAll('#namespaces [role=row][data-namespace]')]"
                ".map(tr => [tr.dataset.cluster, tr.dataset.namespace])"
            )
            == [["b", "team-x"]]
        ),
    )
    assert page_errors(browser) == []


def test_a_single_clusters_list_has_no_cluster_totals(browser: WebDriver, system: System) -> None:
    sign_in(browser, system, system.tokens.reader)
    find(browser, "#namespaces [data-namespace]")

    assert absent(browser, "#list-clusters")
    assert absent(browser, "#namespaces .cluster")
