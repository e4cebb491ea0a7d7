"""The dashboard's files under /ui: served by the timekeeper itself, each answer with a strict
Content-Security-Policy, no inline script anywhere, and nothing outside the static folder reachable."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from timekeeper.app import create_app
from timekeeper.settings import Settings
from timekeeper.ui import CONTENT_SECURITY_POLICY, DOCS_DIR, STATIC_DIR

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture
async def root(app: FastAPI) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://timekeeper")


class _Scripts(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[dict[str, str | None]] = []
        self.inline: list[str] = []
        self.handlers: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handlers += [name for name, _ in attrs if name.startswith("on") or name == "style"]
        if tag == "script":
            self.scripts.append(dict(attrs))
        self._in_script = tag in ("script", "style")

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.inline.append(data)


async def test_ui_redirects_to_its_folder_and_serves_the_page(root: httpx.AsyncClient) -> None:
    redirect = await root.get("/ui")
    page = await root.get("/ui/")

    assert (redirect.status_code, redirect.headers["location"]) == (308, "/ui/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "<title>GPU Timekeeper</title>" in page.text


@pytest.mark.parametrize("path", ["/ui/", "/ui/app.css", "/ui/js/app.js", "/ui/missing.js"])
async def test_every_ui_answer_carries_the_security_headers(root: httpx.AsyncClient, path: str) -> None:
    response = await root.get(path)

    csp = response.headers["content-security-policy"]
    assert csp == CONTENT_SECURITY_POLICY
    assert "script-src 'self'" in csp and "'unsafe-inline'" not in csp and "'unsafe-eval'" not in csp
    assert "frame-ancestors 'none'" in csp and "require-trusted-types-for 'script'" in csp
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["referrer-policy"] == "no-referrer"


async def test_scripts_are_modules_served_as_javascript(root: httpx.AsyncClient) -> None:
    for module in sorted((STATIC_DIR / "js").glob("*.js")):
        response = await root.get(f"/ui/js/{module.name}")
        assert response.status_code == 200
        assert response.headers["content-type"].split(";")[0] in ("text/javascript", "application/javascript")


async def test_no_page_has_inline_script_style_or_handler() -> None:
    for page in STATIC_DIR.rglob("*.html"):
        parser = _Scripts()
        parser.feed(page.read_text())
        assert parser.inline == [], f"{page.name}: inline script or style"
        assert parser.handlers == [], f"{page.name}: inline event handlers or style attributes"
        assert parser.scripts and all(attrs.get("src") for attrs in parser.scripts)


async def test_the_scripts_never_write_markup_from_strings() -> None:
    """Trusted Types would refuse them at run time; this catches them before a browser does."""
    sinks = re.compile(
        r"\.(innerHTML|outerHTML)\s*=|insertAdjacentHTML|document\.write|\beval\(|new Function"
    )
    for module in STATIC_DIR.rglob("*.js"):
        assert not sinks.search(module.read_text()), module.name


@pytest.mark.parametrize("path", ["/ui/../app.py", "/ui/%2e%2e/__init__.py", "/ui/..%2f__init__.py"])
async def test_nothing_outside_the_static_folder_is_served(root: httpx.AsyncClient, path: str) -> None:
    response = await root.get(path)

    assert response.status_code == 404 or "mount_ui" not in response.text


async def test_the_dashboard_can_be_switched_off(settings: Settings) -> None:
    app = create_app(settings.model_copy(update={"ui_enabled": False}))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        assert (await client.get("/ui/")).status_code == 404


@pytest.mark.parametrize("path", ["/docs/", "/docs/swagger-init.js", "/docs/vendor/swagger-ui-bundle.js"])
async def test_the_api_docs_are_served_from_here_under_the_same_policy(
    root: httpx.AsyncClient, path: str
) -> None:
    """Issue #27: /docs loaded Swagger UI from a CDN, without SRI or CSP, on the dashboard's origin."""
    redirect = await root.get("/docs")
    response = await root.get(path)

    assert (redirect.status_code, redirect.headers["location"]) == (308, "/docs/")
    assert response.status_code == 200
    assert response.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert "//" not in "".join(attrs.get("src") or "" for attrs in _page_scripts(DOCS_DIR / "index.html"))


def _page_scripts(page: Path) -> list[dict[str, str | None]]:
    parser = _Scripts()
    parser.feed(page.read_text())
    assert parser.inline == [] and parser.handlers == []
    return parser.scripts
