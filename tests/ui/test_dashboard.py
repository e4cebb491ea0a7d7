"""The dashboard as people use it, in headless Chromium against a real timekeeper: sign in with a token,
read the namespace list, open a namespace and its chart, and (as an admin) grant minutes through the form.
A reader is never shown the admin forms, and the list of 1,000 namespaces is on screen within a second."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

from tests.ui.conftest import CHROMEDRIVER, CHROMIUM, LARGE, STATES, WHY_SKIPPED, System, report_hours

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.browser,
    pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason=WHY_SKIPPED),
]

# Set to a folder to keep screenshots of the views (docs/dashboard.png is one of them).
SCREENSHOTS = os.environ.get("GTK_DASHBOARD_SCREENSHOTS")


def wait_for(browser: WebDriver, condition: Callable[[WebDriver], Any], timeout: float = 15) -> Any:
    """Polls the condition until it holds; an element the page re-rendered between finding and reading it
    (stale) or has not drawn yet is polled again."""
    ignored = (NoSuchElementException, StaleElementReferenceException)
    return WebDriverWait(browser, timeout, poll_frequency=0.05, ignored_exceptions=ignored).until(condition)


def find(browser: WebDriver, css: str, timeout: float = 15) -> WebElement:
    return wait_for(browser, lambda b: b.find_element(By.CSS_SELECTOR, css), timeout)  # type: ignore[no-any-return]


def absent(browser: WebDriver, css: str) -> bool:
    try:
        browser.find_element(By.CSS_SELECTOR, css)
    except NoSuchElementException:
        return True
    return False


def sign_in(browser: WebDriver, system: System, token: str, route: str = "#/") -> None:
    """The real flow: the page asks for a token, the user types it and presses Enter."""
    browser.get(f"{system.url}/ui/")
    browser.execute_script("sessionStorage.clear()")
    browser.get("about:blank")  # a new document: the same URL but its #fragment would not reload
    browser.get(f"{system.url}/ui/{route}")
    field = find(browser, "#token")
    field.send_keys(token, Keys.ENTER)
    find(browser, "#principal")


def list_rows(browser: WebDriver) -> list[tuple[str, str]]:
    """The list's rows as shown, in order: (namespace, state)."""
    rows = browser.execute_script(
        "return [...document.querySelectorAll('#namespaces [role=row][data-namespace]')]"
        ".map(tr => [tr.dataset.namespace, tr.dataset.state])"
    )
    return [(namespace, state) for namespace, state in rows]


def shot(browser: WebDriver, name: str) -> None:
    if SCREENSHOTS:
        Path(SCREENSHOTS).mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(Path(SCREENSHOTS) / f"{name}.png"))


def minutes(value: float) -> str:
    """A whole number of GPU-minutes as the page shows it (the browser runs in en-GB)."""
    assert value == int(value)
    return f"{int(value):,}"


def fresh_namespace(system: System, name: str, budget: int, used_hours: int) -> dict[str, Any]:
    """A namespace of the test's own (tests that change one never disturb another's figures)."""
    system.api("PUT", f"/namespaces/{name}/budget", json={"budget_gpu_minutes": budget})
    report_hours(system, name, "job-0", list(range(1, used_hours + 1)), 1.0)
    return system.budget(name)


def page_errors(browser: WebDriver) -> list[str]:
    """Console entries a broken page would log: CSP or Trusted Types refusals, uncaught errors."""
    return [
        entry["message"]
        for entry in browser.get_log("browser")
        if any(word in entry["message"] for word in ("Content Security Policy", "Trusted Type", "Uncaught"))
    ]


def test_the_list_shows_every_seeded_namespace_and_its_state(browser: WebDriver, system: System) -> None:
    sign_in(browser, system, system.tokens.reader)
    find(browser, "#namespaces [data-namespace]")

    shown = dict(list_rows(browser))
    assert {ns: shown.get(ns) for ns in STATES} == STATES
    listed = system.api("GET", "/namespaces", system.tokens.reader)
    assert f"{len(listed)} namespaces" in find(browser, "#list-summary").text
    assert browser.find_element(By.ID, "principal").text.startswith("reader-token:")
    alpha = browser.find_element(By.CSS_SELECTOR, '[role=row][data-namespace="team-alpha"]').text
    assert "Exhausted" in alpha and "gpu-over-budget" in alpha
    shot(browser, "list")
    assert page_errors(browser) == []


def test_the_list_filters_and_sorts_from_the_keyboard(browser: WebDriver, system: System) -> None:
    sign_in(browser, system, system.tokens.reader)
    find(browser, "#namespaces [data-namespace]")

    find(browser, "#filter-name").send_keys("al")
    wait_for(browser, lambda b: [ns for ns, _ in list_rows(b)] == ["team-alpha"])
    find(browser, "#filter-name").send_keys(Keys.BACKSPACE, Keys.BACKSPACE)
    listed = system.api("GET", "/namespaces", system.tokens.reader)
    wait_for(browser, lambda b: len(list_rows(b)) == len(listed))
    by_remaining = [
        entry["namespace"]
        for entry in sorted(
            listed,
            key=lambda e: (
                e["remaining_gpu_minutes"] is None,
                e["remaining_gpu_minutes"] or 0,
                e["namespace"],
            ),
        )
    ]
    unlimited = [e["namespace"] for e in listed if e["remaining_gpu_minutes"] is None]
    limited = [ns for ns in by_remaining if ns not in unlimited]

    # Sort by remaining minutes: focus the column's button and press Enter, as a keyboard user does.
    remaining = find(browser, 'button[data-sort="remaining"]')
    browser.execute_script("arguments[0].focus()", remaining)
    browser.switch_to.active_element.send_keys(Keys.ENTER)
    header = remaining.find_element(By.XPATH, "..")
    wait_for(browser, lambda b: header.get_attribute("aria-sort") == "ascending")
    # Fewest minutes left first (team-alpha's -160), unlimited namespaces last in either direction.
    assert [ns for ns, _ in list_rows(browser)] == by_remaining
    browser.switch_to.active_element.send_keys(Keys.ENTER)
    wait_for(browser, lambda b: header.get_attribute("aria-sort") == "descending")
    assert [ns for ns, _ in list_rows(browser)] == limited[::-1] + unlimited

    Select(find(browser, "#filter-state")).select_by_visible_text("Warning")
    warning = [(e["namespace"], "warning") for e in listed if e["state"] == "warning"]
    wait_for(browser, lambda b: list_rows(b) == warning)
    assert f"Showing {len(warning)} of {len(listed)}" in find(browser, "#list-shown").text


def test_a_namespace_page_draws_its_chart_and_usage(browser: WebDriver, system: System) -> None:
    sign_in(browser, system, system.tokens.reader)
    find(browser, 'a[href="#/ns/team-alpha"]').click()
    chart = find(browser, "svg#burn-down")

    # The remaining minutes, hour by hour: the period's start, the 8 seeded hours, now.
    actual = chart.find_element(By.CSS_SELECTOR, "path.actual").get_attribute("d") or ""
    assert actual.count("L") >= 8
    assert chart.find_element(By.CSS_SELECTOR, "path.pace").get_attribute("d")
    assert chart.find_element(By.CSS_SELECTOR, "path.actual").size["width"] > 100  # drawn, not collapsed
    budget = system.budget("team-alpha")
    allowance = budget["budget_gpu_minutes"] + budget["granted_gpu_minutes"]
    description = browser.find_element(By.ID, "burn-down-desc").get_attribute("textContent")
    assert f"{minutes(budget['remaining_gpu_minutes'])} of {minutes(allowance)} GPU-minutes remain" in (
        description or ""
    )
    pods = find(browser, "#usage-pods").text
    assert "trainer-0" in pods and "trainer-1" in pods and "Mean SM util" in pods
    workloads = find(browser, "#usage-workloads").text  # static mode: no pod watch, each pod its own
    assert "Pod/trainer-0" in workloads and "Pod/trainer-1" in workloads
    days = browser.find_elements(By.CSS_SELECTOR, "#usage-days tbody tr")
    assert [row.find_element(By.TAG_NAME, "th").text for row in days] == ["2026-03-17", "2026-03-18"]
    assert find(browser, "#ns-state").text == "Exhausted"
    shot(browser, "namespace-reader")
    assert page_errors(browser) == []


def test_a_reader_sees_no_admin_forms(browser: WebDriver, system: System) -> None:
    sign_in(browser, system, system.tokens.reader, "#/ns/team-beta")
    find(browser, "svg#burn-down")
    shot(browser, "namespace-beta")

    for admin_only in ("#admin", "#grant-form", "#budget-form", "#audit", "#nav-audit", "button.revoke"):
        assert absent(browser, admin_only), admin_only
    browser.get(f"{system.url}/ui/#/audit")  # typed by hand: the list, not the audit trail
    find(browser, "#namespaces")
    assert absent(browser, "#audit")


def test_an_admin_grant_through_the_form_changes_the_remaining_minutes(
    browser: WebDriver, system: System
) -> None:
    before = fresh_namespace(system, "team-grant", budget=100, used_hours=3)  # 180 of 100: exhausted
    assert (before["state"], before["remaining_gpu_minutes"]) == ("exhausted", -80)
    sign_in(browser, system, system.tokens.admin, "#/ns/team-grant")
    find(browser, "#grant-form")
    assert find(browser, "#ns-remaining").text == "-80 GPU-min"

    find(browser, "#grant-minutes").send_keys("500")
    find(browser, "#grant-reason").send_keys("paper deadline", Keys.ENTER)

    wait_for(browser, lambda b: b.find_element(By.ID, "ns-remaining").text == "420 GPU-min")
    after = system.budget("team-grant")
    assert (after["remaining_gpu_minutes"], after["granted_gpu_minutes"]) == (420, 500)
    assert (after["state"], find(browser, "#ns-state").text) == ("in_budget", "In budget")
    assert "Granted 500 GPU-minutes to team-grant" in find(browser, "#status").text
    assert "paper deadline" in find(browser, "#grants").text
    assert "grant.create" in find(browser, "#audit").text
    shot(browser, "namespace-admin")
    assert page_errors(browser) == []


def test_a_reader_reads_grants_but_only_an_admin_revokes_one(browser: WebDriver, system: System) -> None:
    fresh_namespace(system, "team-revoke", budget=100, used_hours=1)  # 60 of 100
    grant = system.api(
        "POST", "/namespaces/team-revoke/grants", json={"gpu_minutes": 40, "reason": "demo day"}
    )
    sign_in(browser, system, system.tokens.reader, "#/ns/team-revoke")
    assert "demo day" in find(browser, "#grants").text
    assert absent(browser, "button.revoke")

    sign_in(browser, system, system.tokens.admin, "#/ns/team-revoke")
    assert find(browser, "#ns-remaining").text == "80 GPU-min"
    find(browser, f'tr[data-grant="{grant["id"]}"] button.revoke').click()
    browser.switch_to.alert.accept()

    wait_for(browser, lambda b: b.find_element(By.ID, "ns-remaining").text == "40 GPU-min")
    assert find(browser, f'tr[data-grant="{grant["id"]}"]').get_attribute("data-status") == "revoked"
    assert system.budget("team-revoke")["remaining_gpu_minutes"] == 40


def test_an_admin_sets_a_budget_through_the_form(browser: WebDriver, system: System) -> None:
    fresh_namespace(system, "team-budget", budget=1000, used_hours=1)
    sign_in(browser, system, system.tokens.admin, "#/ns/team-budget")
    budget = find(browser, "#budget-minutes")
    assert budget.get_attribute("value") == "1000"

    budget.clear()
    budget.send_keys("1500")
    find(browser, "#budget-form button[type=submit]").click()

    wait_for(browser, lambda b: "Saved the budget of team-budget" in b.find_element(By.ID, "status").text)
    assert system.budget("team-budget")["budget_gpu_minutes"] == 1500
    assert find(browser, "#ns-remaining").text == "1,440 GPU-min"
    assert "budget.put" in find(browser, "#audit").text


def test_a_refused_form_says_why_and_changes_nothing(browser: WebDriver, system: System) -> None:
    sign_in(browser, system, system.tokens.admin, "#/ns/team-gamma")
    before = system.budget("team-gamma")
    warn = find(browser, "#budget-warn")
    # Within the field's bounds, but finer than the API keeps (4 decimal places): the API's 422 is shown.
    warn.clear()
    warn.send_keys("0.12345")
    find(browser, "#budget-form button[type=submit]").click()

    error = wait_for(browser, lambda b: b.find_element(By.ID, "budget-form-error").text or False)
    assert "warn_at_fraction" in error
    after = system.budget("team-gamma")
    assert {**after, "forecast": None} == {**before, "forecast": None}  # the forecast moves with the clock


def test_a_token_that_is_not_accepted_is_asked_for_again(browser: WebDriver, system: System) -> None:
    browser.get(f"{system.url}/ui/")
    browser.execute_script("sessionStorage.clear()")
    browser.get("about:blank")
    browser.get(f"{system.url}/ui/")
    find(browser, "#token").send_keys("not-a-token", Keys.ENTER)

    assert "not accepted" in find(browser, "#sign-in-error").text
    assert browser.execute_script("return sessionStorage.length") == 0


def test_every_control_has_a_label(browser: WebDriver, system: System) -> None:
    sign_in(browser, system, system.tokens.admin, "#/ns/team-beta")
    find(browser, "#grant-form")
    unlabelled = browser.execute_script(
        "return [...document.querySelectorAll('input, select, textarea')]"
        ".filter(e => !e.labels.length && !e.getAttribute('aria-label')).map(e => e.id)"
    )
    assert unlabelled == []
    browser.get(f"{system.url}/ui/#/")
    find(browser, "#namespaces")
    assert browser.execute_script(
        "return [...document.querySelectorAll('input, select')].every(e => e.labels.length)"
    )


def test_1000_namespaces_are_on_screen_within_a_second(browser: WebDriver, large_system: System) -> None:
    sign_in(browser, large_system, large_system.tokens.reader)
    find(browser, "body[data-list-painted]")
    browser.refresh()  # a fresh load, token already in the tab: what a returning user sees
    find(browser, "body[data-list-painted]", timeout=30)
    find(browser, 'body[data-list-complete="true"]', timeout=30)

    timings = browser.execute_script(
        "return Object.fromEntries(performance.getEntriesByType('measure')"
        ".filter(m => m.name.startsWith('gtk:list')).map(m => [m.name, m.duration]))"
    )
    rows = browser.execute_script(
        "return document.querySelectorAll('#namespaces [role=row][data-namespace]').length"
    )
    print(f"\n1,000 namespaces: {json.dumps(timings)}")
    assert rows == LARGE
    # Rendering: from the API's answer to the frame that shows the list painted (1,000 entries sorted, the
    # first screenful of rows built, laid out and drawn; the rest are built in slices between frames, all
    # in the document at `gtk:list:complete`, printed). The request before it is the server's time
    # (`gtk:list` counts both; the server's own figures are the benchmarks' business, not a timed test's).
    assert timings["gtk:list:render"] < 1000, timings
    assert timings["gtk:list:complete"] < 10_000, timings  # every row arrives, at the latest in seconds
    shot(browser, "list-large")
