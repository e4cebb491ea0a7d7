"""What every benchmark shares: the machine's description, percentiles, results and the report file."""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy.engine import URL, make_url

from tests.support.postgres import url_string
from tests.support.processes import (
    free_port as free_port,
)  # re-exported: the one helper, shared with the tests
from tests.support.timekeeper import migrate

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_FILE = REPO_ROOT / "bench" / "RESULTS.md"


@dataclass
class Figure:
    """One measured figure, with the target it is held to and the same-run baseline it is compared with."""

    name: str
    value: float
    unit: str
    target: str = ""
    baseline: float | None = None
    baseline_name: str = ""
    note: str = ""

    @property
    def ratio(self) -> str:
        if not self.baseline:
            return ""
        return f"{self.value / self.baseline:.2f}x of {self.baseline:,.1f} {self.unit} ({self.baseline_name})"


@dataclass
class Section:
    title: str
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def progress(message: str) -> None:
    """One line on stderr as each step begins, so a long `make bench` is never silent."""
    one, _, _ = os.getloadavg()
    print(f"[bench {datetime.now(UTC):%H:%M:%S} load {one:.1f}] {message}", file=sys.stderr, flush=True)


def percentile(samples: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile; fraction in [0, 1]."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    rank = max(0, min(len(ordered) - 1, round(fraction * len(ordered) + 0.5) - 1))
    return ordered[rank]


def machine_description() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{os.cpu_count()} cores ({cpu}), {memory_gib:.0f} GiB, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def write_results(sections: Sequence[Section], path: Path = RESULTS_FILE) -> None:
    """Rewrite RESULTS.md with this run's figures; the file is the benchmarks' written record."""
    lines = [
        "# Benchmark results",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M UTC} by `make bench` on: {machine_description()}.",
        "Every figure runs against real processes and a real PostgreSQL on this one machine; the baseline",
        "beside it was measured in the same run on the same machine.",
        "",
    ]
    for section in sections:
        lines += [f"## {section.title}", ""]
        if section.figures:
            lines += ["| figure | value | target | vs. baseline |", "|---|---|---|---|"]
        for figure in section.figures:
            lines.append(
                f"| {figure.name} | {figure.value:,.2f} {figure.unit} | {figure.target} | {figure.ratio} |"
            )
        if section.figures:
            lines.append("")
        lines += [f"- {note}" for note in section.notes]
        if section.notes:
            lines.append("")
    lines += _sections_kept(path, {section.title for section in sections})
    path.write_text("\n".join(lines))


def _sections_kept(path: Path, written: set[str]) -> list[str]:
    """The file's sections this run does not write (`make bench-history`'s, the profiles measured by hand)."""
    if not path.exists():
        return []
    parts = path.read_text().split("\n## ")[1:]
    return [f"## {part.rstrip()}\n" for part in parts if part.split("\n", 1)[0] not in written]


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


@contextmanager
def process(
    args: Sequence[str], env: dict[str, str] | None = None, port: int | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run a child process for the duration of a benchmark, waiting for its port when given."""
    # Its log goes to a file: a pipe no one drains fills up and then blocks the child's next log line.
    with tempfile.TemporaryFile() as log:
        child = subprocess.Popen(
            list(args),
            cwd=REPO_ROOT,
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        try:
            if port is not None:
                try:
                    wait_for_port(port)
                except TimeoutError:
                    child.kill()
                    log.seek(0)
                    raise RuntimeError(f"{args} did not start: {log.read().decode()[-2000:]}") from None
            yield child
        finally:
            child.terminate()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()


PYTHON = sys.executable


def asgi_caller(
    app: Any, path: str, body: bytes, headers: Sequence[tuple[bytes, bytes]] = (), method: str = "POST"
) -> Callable[[], Awaitable[int]]:
    """One request through the whole ASGI app, with the cheapest possible receive/send; any status but
    200 raises. The call answers the size of the response body."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "https",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *headers,
        ],
        "server": ("127.0.0.1", 8443),
        "client": ("127.0.0.1", 50000),
    }
    message = {"type": "http.request", "body": body, "more_body": False}

    async def receive() -> dict[str, Any]:
        return message

    sent = [0]

    async def send(reply: dict[str, Any]) -> None:
        if reply["type"] == "http.response.start" and reply["status"] != 200:
            raise RuntimeError(f"status {reply['status']}")
        if reply["type"] == "http.response.body":
            sent[0] += len(reply.get("body", b""))

    async def call() -> int:
        sent[0] = 0
        await app(dict(scope), receive, send)
        return sent[0]

    return call


# The benchmarks' PostgreSQL, configured as production would run it on a small machine (2 cores, 23 GiB,
# shared with other work): autovacuum on at its default thresholds, durable commits. Written into the
# results beside the figures.
POSTGRES_SETTINGS = {
    "autovacuum": "on",
    # A benchmark lives seconds where a timekeeper lives days: autovacuum looks every second (production:
    # every minute), so tables are analysed as they grow, as a long-running server's are.
    "autovacuum_naptime": "1s",
    "autovacuum_vacuum_threshold": "50",
    "autovacuum_analyze_threshold": "50",
    "autovacuum_vacuum_scale_factor": "0.2",
    "autovacuum_analyze_scale_factor": "0.1",
    "shared_buffers": "4GB",
    "effective_cache_size": "12GB",
    "work_mem": "16MB",
    "maintenance_work_mem": "256MB",
    "max_wal_size": "4GB",
    "checkpoint_timeout": "15min",
    "wal_compression": "on",
    "random_page_cost": "1.1",
    "synchronous_commit": "on",
    "fsync": "on",
    "max_connections": "100",
}


def postgres_settings_note(settings: Mapping[str, str] = POSTGRES_SETTINGS) -> str:
    return "PostgreSQL, a private server started for the run: " + ", ".join(
        f"{key}={value}" for key, value in settings.items()
    )


@contextmanager
def postgres_server(settings: Mapping[str, str] = POSTGRES_SETTINGS) -> Iterator[URL]:
    """A private server with `settings` (initdb from the machine's binaries, run as `postgres` when we
    are root), stopped and removed afterwards; yields its maintenance database's URL."""
    binaries = Path(subprocess.check_output(["pg_config", "--bindir"], text=True).strip())
    if not (binaries / "initdb").exists():
        binaries = max(Path("/usr/lib/postgresql").glob("*/bin"))
    data = Path(tempfile.mkdtemp(prefix="gtk-bench-pg-"))
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_user:
        shutil.chown(data, "postgres")
    port = free_port()
    options = " ".join(f"-c {key}={value}" for key, value in settings.items())
    subprocess.run(
        [*as_user, binaries / "initdb", "-D", data / "pg", "-U", "postgres", "-A", "trust", "--no-sync"],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            *as_user,
            binaries / "pg_ctl",
            "-D",
            data / "pg",
            "-w",
            "-l",
            data / "pg.log",
            "-o",
            f"-p {port} -k {data} -c listen_addresses=127.0.0.1 {options}",
            "start",
        ],
        check=True,
        capture_output=True,
    )
    try:
        yield make_url(f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres")
    finally:
        subprocess.run(
            [*as_user, binaries / "pg_ctl", "-D", data / "pg", "-m", "fast", "stop"], capture_output=True
        )
        shutil.rmtree(data, ignore_errors=True)


def dsn(url: URL) -> str:
    """The URL as libpq takes it."""
    return url_string(url).replace("postgresql+psycopg://", "postgresql://")


def new_database(server: URL, name: str) -> URL:
    """A database `name` on the server, migrated to head."""
    with psycopg.connect(dsn(server), autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    url = server.set(database=name)
    migrate(url)
    return url


@contextmanager
def fresh_database(server: URL, name: str) -> Iterator[URL]:
    """new_database, dropped when the block ends (whoever is still connected is disconnected)."""
    url = new_database(server, name)
    try:
        yield url
    finally:
        with psycopg.connect(dsn(server), autocommit=True) as connection:
            connection.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
