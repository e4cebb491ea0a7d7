"""The dashboard with budgets per GPU model (issue #41), in headless Chromium against a stand-in timekeeper:
the real /ui (its files and security headers, timekeeper.ui.mount_ui) beside an /api/v1 that answers the
recorded answers of tests/support/model_budgets.py. The namespace page shows each model's remaining
minutes and state under the total's; the list marks a namespace with an exhausted model; a budget without
models shows nothing new."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, HTTPException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.support import model_budgets
from tests.support.model_budgets import A100, H100
from tests.support.processes import free_port, wait_until
from tests.ui.conftest import CHROMEDRIVER, CHROMIUM, WHY_SKIPPED
from tests.ui.test_dashboard import absent, find, wait_for
from timekeeper.ui import mount_ui

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.browser,
    pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason=WHY_SKIPPED),
]

BUDGETS = {answer["namespace"]: answer for answer in model_budgets.namespaces()}


def recorded_api() -> FastAPI:
    """The answers the dashboard asks for, as a cluster-wide reader gets them."""
    app = FastAPI()
    mount_ui(app)

    @app.get("/api/v1/whoami")
    def whoami(namespace: str | None = None) -> dict[str, Any]:
        return model_budgets.whoami(namespace)

    @app.get("/api/v1/namespaces")
    def namespaces() -> list[dict[str, Any]]:
        return model_budgets.namespaces()

    @app.get("/api/v1/namespaces/{namespace}/budget")
    def budget(namespace: str) -> dict[str, Any]:
        if namespace not in BUDGETS:
            raise HTTPException(404, "no such namespace")
        return BUDGETS[namespace]

    @app.get("/api/v1/namespaces/{namespace}/usage")
    def usage(namespace: str, group_by: str) -> dict[str, Any]:
        return model_budgets.usage(namespace, group_by)

    @app.get("/api/v1/namespaces/{namespace}/grants")
    def grants(namespace: str) -> list[dict[str, Any]]:
        return []

    return app


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(recorded_api(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, what="the stand-in timekeeper to serve")
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def open_page(browser: WebDriver, url: str, route: str) -> None:
    """A fresh document at the route: the stand-in answers /whoami without a token. The browser's log
    is emptied first (reading it does): it is the session's, other modules' pages included."""
    browser.get_log("browser")
    browser.get("about:blank")
    browser.get(f"{url}/ui/{route}")
    find(browser, "#principal")


def test_the_namespace_page_shows_each_models_remaining_minutes_and_state(
    browser: WebDriver, url: str
) -> None:
    open_page(browser, url, "#/ns/team-a")

    table = find(browser, "#model-budgets")
    rows = {row.get_attribute("data-model"): row for row in table.find_elements(By.CSS_SELECTOR, "tbody tr")}
    assert list(rows) == [A100, H100]  # sorted
    h100 = [cell.text for cell in rows[H100].find_elements(By.CSS_SELECTOR, "th, td")]
    assert h100 == [H100, "Exhausted", "10", "10", "0", "already spent"]
    assert rows[H100].get_attribute("data-state") == "exhausted"
    a100 = [cell.text for cell in rows[A100].find_elements(By.CSS_SELECTOR, "th, td")]
    assert a100[:5] == [A100, "In budget", "500", "120", "380"]
    assert (
        rows[A100].find_element(By.CSS_SELECTOR, "time").get_attribute("datetime") == "2026-03-25T08:00:00Z"
    )
    # The total's facts are unchanged, above: in budget.
    assert find(browser, "#ns-state").text == "In budget"
    policy = find(browser, "#model-policy").text
    assert "reduced class (reduce)" in policy and "2.5" in policy


@pytest.mark.parametrize("namespace", ["team-b", "team-c"])
def test_a_budget_without_models_shows_nothing_new(browser: WebDriver, url: str, namespace: str) -> None:
    open_page(browser, url, f"#/ns/{namespace}")

    find(browser, "#budget-facts")
    find(browser, "#usage-pods")
    assert absent(browser, "#model-budgets") and absent(browser, "#model-policy")


def test_the_list_marks_a_namespace_with_an_exhausted_model(browser: WebDriver, url: str) -> None:
    open_page(browser, url, "#/")

    def row(namespace: str) -> Any:
        return find(browser, f'#namespaces [data-namespace="{namespace}"]')

    marker = wait_for(browser, lambda b: row("team-a").find_element(By.CSS_SELECTOR, ".model-marker"))
    assert marker.text == "1 model exhausted"
    assert marker.get_attribute("title") == f"Exhausted models: {H100}"
    assert row("team-a").get_attribute("data-state") == "in_budget"  # the total's state, as before
    for namespace in ("team-b", "team-c"):
        assert not row(namespace).find_elements(By.CSS_SELECTOR, ".model-marker")
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert not errors, errors
