"""The web dashboard: static files served under /ui, calling /api/v1 with the user's own token
(docs/dashboard.md). Every answer under /ui and /docs carries a strict Content-Security-Policy (no
inline script or style, no framing, Trusted Types), and /docs' files come from the image, never a CDN."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from starlette.exceptions import HTTPException
from starlette.responses import PlainTextResponse, RedirectResponse
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

UI_PATH = "/ui"
STATIC_DIR = Path(__file__).resolve().parent / "static"
DOCS_PATH = "/docs"
DOCS_DIR = Path(__file__).resolve().parent / "apidocs"

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
        "require-trusted-types-for 'script'",
        "trusted-types 'none'",
    )
)
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
    (b"permissions-policy", b"camera=(), microphone=(), geolocation=(), payment=(), usb=()"),
    # Revalidated on every load (StaticFiles answers 304 by ETag): an upgraded timekeeper serves new files.
    (b"cache-control", b"no-cache"),
)


class SecurityHeaders:
    """Adds SECURITY_HEADERS to every response of the wrapped app (replacing any of the same name),
    including the 404 and 405 StaticFiles raises rather than answers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._names = {name for name, _ in SECURITY_HEADERS}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in self._names]
                message = {**message, "headers": [*kept, *SECURITY_HEADERS]}
            await send(message)

        try:
            await self.app(scope, receive, with_headers)
        except HTTPException as error:
            await PlainTextResponse(str(error.detail), error.status_code)(scope, receive, with_headers)


def _redirect(app: FastAPI, path: str, to: str) -> None:
    async def redirect() -> RedirectResponse:
        return RedirectResponse(to, status_code=308)

    app.add_api_route(path, redirect, methods=["GET", "HEAD"], include_in_schema=False)


def _serve(app: FastAPI, path: str, directory: Path, name: str) -> None:
    app.mount(path, SecurityHeaders(StaticFiles(directory=directory, html=True)), name=name)


def mount_ui(app: FastAPI) -> None:
    """Serves the dashboard under /ui/ (index.html for the folder) and redirects /ui there."""
    _redirect(app, UI_PATH, f"{UI_PATH}/")
    _serve(app, UI_PATH, STATIC_DIR, "ui")


def mount_docs(app: FastAPI) -> None:
    """Serves Swagger UI at /docs/ (/docs redirects there), its script and style from the installed
    `fastapi-offline` package under /docs/vendor/."""
    vendor = Path(str(files("fastapi_offline") / "static"))
    _redirect(app, DOCS_PATH, f"{DOCS_PATH}/")
    _serve(app, f"{DOCS_PATH}/vendor", vendor, "docs-vendor")  # before /docs, which would match it too
    _serve(app, DOCS_PATH, DOCS_DIR, "docs")
