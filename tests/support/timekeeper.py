"""Helpers for the timekeeper's tests: migrate a database, tokens made at run time, a small API client
whose methods read like the rules under test, and report factories."""

from __future__ import annotations

import atexit
import hashlib
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

import httpx
from alembic import command
from alembic.config import Config
from sqlalchemy.engine import URL

from gpuaccounting.wire import build_report
from tests.support.postgres import REPO_ROOT, create_database, drop_database, url_string


def alembic_config(url: URL) -> Config:
    """The repository's alembic.ini, aimed at the given database."""
    config = Config(str(REPO_ROOT / "alembic.ini"))
    config.attributes["database_url"] = url_string(url)
    config.attributes["configure_logging"] = False
    return config


def migrate(url: URL, revision: str = "head") -> None:
    """`alembic upgrade head` (or down to an older revision, "base" for none) through alembic's own
    command API, on the given database."""
    config = alembic_config(url)
    if revision == "head":
        command.upgrade(config, revision)
    else:
        command.downgrade(config, revision)


_templates: dict[date, URL] = {}
_templates_lock = threading.Lock()


def migrated_template() -> URL:
    """A database migrated to head once per run (and per UTC day: the ledger's first partitions follow the
    date), never connected to afterwards, so that each migrated_database is a copy, not a migration."""
    today = datetime.now(UTC).date()
    with _templates_lock:
        if today not in _templates:
            url = create_database("gtk_template")
            atexit.register(drop_database, url)
            migrate(url)
            _templates[today] = url
        return _templates[today]


@contextmanager
def migrated_database(prefix: str) -> Iterator[URL]:
    """A database of its own, migrated to head (a copy of migrated_template()), dropped afterwards."""
    url = create_database(prefix, template=migrated_template())
    try:
        yield url
    finally:
        drop_database(url)


def sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Tokens:
    """Fresh bearer tokens per test run; settings hold only their digests."""

    admin: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    reporter: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    reader: str = field(default_factory=lambda: secrets.token_urlsafe(24))

    def settings(self) -> dict[str, Any]:
        return {
            "admin_token_sha256": sha256(self.admin),
            "reporter_token_sha256": sha256(self.reporter),
            "reader_token_sha256": sha256(self.reader),
        }

    def env(self) -> dict[str, str]:
        """The same, as the environment of a `python -m timekeeper` process in static auth mode."""
        return {"TIMEKEEPER_AUTH_MODE": "static"} | {
            f"TIMEKEEPER_{key.upper()}": value for key, value in self.settings().items()
        }


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def report_body(
    namespace: str = "team-a",
    pod: str = "trainer-0",
    pod_uid: str = "uid-trainer-0",
    seq: int = 1,
    start: datetime | None = None,
    minutes: float = 1.0,
    end: datetime | None = None,
    gpu_share: float = 1.0,
    **overrides: Any,
) -> dict[str, Any]:
    """A report as a sidecar sends it (gpuaccounting.wire.build_report), one GPU sampled."""
    assert start is not None, "every report in a test says when it starts"
    body: dict[str, Any] = dict(
        build_report(
            namespace=namespace,
            pod=pod,
            pod_uid=pod_uid,
            seq=seq,
            interval_start=start,
            interval_end=end or start + timedelta(minutes=minutes),
            gpu_share=gpu_share,
            gpus=[
                {"uuid": "GPU-0", "sm_util_pct": 50.0, "mem_used_bytes": 1 << 30, "mem_total_bytes": 1 << 34}
            ],
        )
    )
    body.update(overrides)
    return body


class Api:
    """The v1 API as tests use it: each call returns the response; `ok()` insists on a 2xx."""

    def __init__(self, client: httpx.AsyncClient, tokens: Tokens) -> None:
        self.client = client
        self.tokens = tokens

    async def report(self, token: str | None = None, **fields: Any) -> httpx.Response:
        return await self.client.post(
            "/reports", json=report_body(**fields), headers=bearer(token or self.tokens.reporter)
        )

    async def put_budget(self, namespace: str, token: str | None = None, **fields: Any) -> httpx.Response:
        body = {"budget_gpu_minutes": 100, "period": "monthly", **fields}
        return await self.client.put(
            f"/namespaces/{namespace}/budget", json=body, headers=bearer(token or self.tokens.admin)
        )

    async def delete_budget(self, namespace: str) -> httpx.Response:
        return await self.client.delete(f"/namespaces/{namespace}/budget", headers=bearer(self.tokens.admin))

    async def put_defaults(self, **fields: Any) -> httpx.Response:
        body = {"budget_gpu_minutes": 100, "period": "monthly", **fields}
        return await self.client.put("/defaults", json=body, headers=bearer(self.tokens.admin))

    async def grant(
        self, namespace: str, gpu_minutes: float, reason: str = "deadline", **fields: Any
    ) -> httpx.Response:
        return await self.client.post(
            f"/namespaces/{namespace}/grants",
            json={"gpu_minutes": gpu_minutes, "reason": reason, **fields},
            headers=bearer(self.tokens.admin),
        )

    async def budget(self, namespace: str) -> dict[str, Any]:
        return ok(
            await self.client.get(f"/namespaces/{namespace}/budget", headers=bearer(self.tokens.reader))
        )

    async def get(self, path: str, **params: Any) -> httpx.Response:
        return await self.client.get(path, params=params, headers=bearer(self.tokens.admin))


def ok(response: httpx.Response) -> Any:
    assert response.is_success, f"{response.status_code}: {response.text}"
    return response.json()
