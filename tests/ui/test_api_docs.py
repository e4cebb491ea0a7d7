"""/docs in headless Chromium: Swagger UI renders from the timekeeper's own files under the dashboard's
Content-Security-Policy and asks no other origin for anything (issue #27: it came from a CDN without SRI
or CSP, on the origin whose sessionStorage holds the dashboard's token)."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
from selenium.webdriver.remote.webdriver import WebDriver

from tests.ui.conftest import CHROMEDRIVER, CHROMIUM, WHY_SKIPPED, System
from tests.ui.test_dashboard import find, page_errors

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.browser,
    pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason=WHY_SKIPPED),
]


def origins_fetched(browser: WebDriver) -> set[str]:
    """The origins of every resource the page loaded (the document's own included)."""
    urls = browser.execute_script(
        "return [location.href, ...performance.getEntriesByType('resource').map(e => e.name)]"
    )
    return {f"{urlsplit(url).scheme}://{urlsplit(url).netloc}" for url in urls}


def test_swagger_ui_renders_from_this_origin_alone(browser: WebDriver, system: System) -> None:
    browser.get_log("browser")  # what earlier tests left
    browser.get(f"{system.url}/docs")

    find(browser, ".swagger-ui .opblock-summary-path", timeout=30)
    assert "GPU Timekeeper" in browser.find_element("css selector", ".swagger-ui .info").text
    assert origins_fetched(browser) == {system.url}
    assert page_errors(browser) == []
