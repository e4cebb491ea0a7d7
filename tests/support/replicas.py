"""Real timekeeper processes competing for the scheduler's leadership: `python -m timekeeper` replicas
(their /readyz says who leads) and `python -m timekeeper.scheduler` (its /metrics does)."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy.engine import URL

from tests.support.postgres import REPO_ROOT, url_string
from tests.support.processes import LOCAL_HTTP, TimekeeperProcess, free_port, wait_until
from tests.support.timekeeper import bearer, sha256


@dataclass
class Replica:
    process: TimekeeperProcess
    reader_token: str  # /readyz shows the scheduler's status to a reader only

    @property
    def url(self) -> str:
        return self.process.url

    @property
    def name(self) -> str:
        assert self.process.process is not None
        return f"{socket.gethostname()}:{self.process.process.pid}"

    def alive(self) -> bool:
        return self.process.process is not None and self.process.process.poll() is None

    def kill(self) -> None:
        """SIGKILL: no goodbye; the server drops the process's sessions, and its lock with them."""
        assert self.process.process is not None
        self.process.process.kill()
        self.process.process.wait(timeout=10)


@contextmanager
def started_replicas(
    database: URL, env: dict[str, str], log_dir: Path, count: int = 2
) -> Iterator[list[Replica]]:
    """`count` API replicas on one database, each healthy before this yields; stopped afterwards."""
    reader = secrets.token_urlsafe(24)
    digests = [env["TIMEKEEPER_READER_TOKEN_SHA256"]] if env.get("TIMEKEEPER_READER_TOKEN_SHA256") else []
    env = {**env, "TIMEKEEPER_READER_TOKEN_SHA256": ",".join([*digests, sha256(reader)])}
    started = [
        Replica(TimekeeperProcess(database, env, free_port(), log_dir / f"timekeeper-{n}.log"), reader)
        for n in range(count)
    ]
    try:
        for replica in started:  # side by side: each start is mostly imports, on a core of its own
            replica.process.launch()
        for replica in started:
            replica.process.wait_healthy()
        yield started
    finally:
        for replica in started:
            replica.process.stop()


async def scheduler_status(client: httpx.AsyncClient, replica: Replica) -> dict | None:
    try:
        answer = await client.get(f"{replica.url}/readyz", headers=bearer(replica.reader_token))
    except httpx.TransportError:
        return None
    return answer.json()["scheduler"] if answer.status_code == 200 else None


async def wait_for_leader(client: httpx.AsyncClient, candidates: list[Replica]) -> Replica:
    """The one replica whose /readyz says it leads (after checking that no other one says so)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        statuses = [await scheduler_status(client, replica) for replica in candidates]
        leaders = [r for r, status in zip(candidates, statuses, strict=True) if status and status["leader"]]
        if leaders:
            assert len(leaders) == 1, "two replicas lead at once"
            return leaders[0]
        await asyncio.sleep(0.05)
    raise AssertionError("no replica became the leader")


@dataclass
class SchedulerProcess:
    process: subprocess.Popen[bytes]
    log: Path
    metrics_url: str

    @property
    def replica(self) -> str:
        return f"{socket.gethostname()}:{self.process.pid}"

    def wait_for_metric(self, wanted: str, what: str) -> None:
        """Until its /metrics holds `wanted` (it must not exit meanwhile)."""

        def present() -> bool:
            assert self.process.poll() is None, self.log.read_text()
            try:
                return wanted in LOCAL_HTTP.get(self.metrics_url, timeout=1).text
            except httpx.HTTPError:
                return False

        wait_until(present, timeout=30, what=what)


@contextmanager
def scheduler_process(database: URL, env: dict[str, str], log: Path) -> Iterator[SchedulerProcess]:
    """`python -m timekeeper.scheduler --metrics-port ...` on the database; SIGTERMed afterwards, and
    expected to exit cleanly."""
    port = free_port()
    with log.open("wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "timekeeper.scheduler", "--metrics-port", str(port)],
            cwd=REPO_ROOT,
            env={**os.environ, "TIMEKEEPER_DATABASE_URL": url_string(database), **env},
            stdout=output,
            stderr=output,
        )
    try:
        yield SchedulerProcess(process, log, f"http://127.0.0.1:{port}/metrics")
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0, log.read_text()
