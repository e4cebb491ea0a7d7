"""What one client may cost `python -m timekeeper` (gpuserving.connections), over real sockets.

Each limit is held against the probe of issue #27 that found it unbounded: a 64 MiB header line parsed on
the event loop (a report beside it took 8.5 s), 3,000 partial heads all still open after 65 s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy.engine import URL

from tests.support.hostile_clients import MIB, huge_header_line, slow_heads
from tests.support.processes import TimekeeperProcess, free_port
from tests.support.timekeeper import Tokens, bearer, migrated_database, report_body

pytestmark = pytest.mark.e2e

HEAD_TIMEOUT = 2


@pytest.fixture(scope="module")
def database_url() -> Iterator[URL]:
    """A database of this module's own: the served process commits its reports."""
    with migrated_database("gtk_connection_limits") as url:
        yield url


@contextlib.contextmanager
def _timekeeper(database_url: URL, tmp_path: Path, tokens: Tokens, **limits: str) -> Iterator[str]:
    env = {**tokens.env(), "TIMEKEEPER_SCHEDULER_ENABLED": "false", **limits}
    process = TimekeeperProcess(database_url, env, free_port(), tmp_path / "timekeeper.log")
    process.start()
    try:
        yield process.url
    finally:
        process.stop()


async def _report(url: str, tokens: Tokens, pod: str) -> int:
    start = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=2)
    body = report_body(pod=pod, pod_uid=f"uid-{pod}", start=start)
    async with httpx.AsyncClient(base_url=f"{url}/api/v1", timeout=30) as client:
        return (await client.post("/reports", json=body, headers=bearer(tokens.reporter))).status_code


def test_a_64_mib_header_line_is_refused_and_a_report_beside_it_is_served(
    database_url: URL, tmp_path: Path
) -> None:
    tokens = Tokens()
    with _timekeeper(database_url, tmp_path, tokens) as url:
        port = httpx.URL(url).port
        assert port is not None

        async def probe() -> tuple[tuple[bytes, int, float], int]:
            huge = asyncio.ensure_future(huge_header_line(port, 64 * MIB))
            await asyncio.sleep(0.05)
            status = await _report(url, tokens, "beside-huge")
            return await huge, status

        (answer, sent, _), status = asyncio.run(probe())

    assert answer.startswith(b"HTTP/1.1 431") or answer == b""  # or reset before the answer was read
    assert sent < 8 * MIB  # refused long before the line ended
    assert status == 200


def test_3000_slow_heads_are_dropped_at_the_head_timeout(database_url: URL, tmp_path: Path) -> None:
    tokens = Tokens()
    limits = {
        "TIMEKEEPER_HEAD_TIMEOUT_SECONDS": str(HEAD_TIMEOUT),
        "TIMEKEEPER_MAX_CONNECTIONS": "4000",
        "TIMEKEEPER_MAX_CONNECTIONS_PER_SOURCE": "4000",
    }
    with _timekeeper(database_url, tmp_path, tokens, **limits) as url:
        port = httpx.URL(url).port
        assert port is not None
        opened, (still_open,) = asyncio.run(slow_heads(port, 3000, [HEAD_TIMEOUT + 3], until_closed=True))
        status = asyncio.run(_report(url, tokens, "after-slow-heads"))

    assert opened == 3000
    assert still_open == 0
    assert status == 200


def test_connections_beyond_the_caps_are_dropped_at_once(database_url: URL, tmp_path: Path) -> None:
    """50 in all, 20 from one address: the hostile address gets 20, the rest stays the sidecars'."""
    tokens = Tokens()
    limits = {"TIMEKEEPER_MAX_CONNECTIONS": "50", "TIMEKEEPER_MAX_CONNECTIONS_PER_SOURCE": "20"}
    with _timekeeper(database_url, tmp_path, tokens, **limits) as url:
        port = httpx.URL(url).port
        assert port is not None
        opened, (still_open,) = asyncio.run(slow_heads(port, 100, [0.5]))
        status = asyncio.run(_report(url, tokens, "beside-the-cap"))

    assert opened == 100  # the kernel accepts each; the server closes those beyond the cap
    assert still_open == 20
    assert status == 200
