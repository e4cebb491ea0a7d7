"""What one client, or one tenant's many pods, may cost `python -m timekeeper` (httpguard.connections),
over real sockets.

Each limit is held against the probe of issue #27 or #38 that found it unbounded: a 64 MiB header line
parsed on the event loop (a report beside it took 8.5 s), 3,000 partial heads all still open after 65 s,
1,000 from 10 addresses filling the table, connections answered before their body never closed, a 64 MiB
trailer appended into the request's headers.
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

from tests.support.hostile_clients import (
    MIB,
    Hostile,
    beside_hostile,
    good_timekeeper_requests,
    hostile_sources,
    huge_header_line,
    huge_trailer,
    image_malloc_env,
    plain_request,
    slow_heads,
)
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
    env = {
        **image_malloc_env("timekeeper"),
        **tokens.env(),
        "TIMEKEEPER_SCHEDULER_ENABLED": "false",
        **limits,
    }
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


def _refused(url: str, tokens: Tokens, reason: str) -> float:
    scrape = httpx.get(f"{url}/api/v1/metrics", headers=bearer(tokens.admin)).text
    line = f'timekeeper_connections_refused_total{{reason="{reason}"}} '
    return float(next(row for row in scrape.splitlines() if row.startswith(line)).split()[-1])


@pytest.mark.parametrize(
    ("kind", "sources", "head", "body"),
    [
        ("slow_heads", 10, b"POST /api/v1/reports HTTP/1.1\r\nHost: timekeeper\r\n", b""),
        (
            "answer_before_body",
            5,
            b"POST /api/v1/reports HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 2\r\n\r\n",
            b"{}",
        ),
    ],
    ids=["slow-heads-from-10-addresses", "answered-before-body-from-5-addresses"],
)
def test_reports_and_reads_pass_beside_1000_hostile_connections(
    database_url: URL, tmp_path: Path, kind: str, sources: int, head: bytes, body: bytes
) -> None:
    """Issue #38: 1,000 slow heads from 10 addresses let 19 of 29 reports through; 1,000 connections from
    5 addresses answered 401 before their body (uvicorn's keep-alive timer cancelled by it) stayed open
    for ever, and 0 of 20 reads passed. Now the waiting connections give way, and all have a deadline."""
    tokens = Tokens()
    with _timekeeper(database_url, tmp_path, tokens, TIMEKEEPER_HEAD_TIMEOUT_SECONDS="5") as url:
        port = httpx.URL(url).port
        assert port is not None
        hostile = Hostile(kind, port, 1000, hostile_sources(sources), head=head, body=body, checks=(8.0,))
        outcomes, seen = asyncio.run(
            beside_hostile(hostile, good_timekeeper_requests(port, tokens.reporter, tokens.reader), 20)
        )
        gave_way = _refused(url, tokens, "gave_way_head" if kind == "slow_heads" else "gave_way_idle")

    assert seen.made == 1000
    assert sum(outcomes) >= 0.95 * len(outcomes)
    assert seen.still_open[0] <= 100  # 5 s head timeout, 5 s keep-alive: checked 8 s after
    assert gave_way >= 1


def test_a_64_mib_trailer_is_refused_and_healthz_beside_it_answers(database_url: URL, tmp_path: Path) -> None:
    """Issue #38: a 64 MiB chunked trailer was appended (quadratically) into the report's headers; a
    /healthz beside it took 5.8 s."""
    tokens = Tokens()
    head = (
        "POST /api/v1/reports HTTP/1.1\r\nHost: timekeeper\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {tokens.reporter}\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    healthz = b"GET /api/v1/healthz HTTP/1.1\r\nHost: timekeeper\r\nConnection: close\r\n\r\n"
    with _timekeeper(database_url, tmp_path, tokens) as url:
        port = httpx.URL(url).port
        assert port is not None

        async def probe() -> tuple[tuple[bytes, int, float], int]:
            trailer = asyncio.ensure_future(huge_trailer(port, 64 * MIB, head))
            await asyncio.sleep(0.05)
            beside = await plain_request(port, healthz, 1.0)
            return await trailer, beside

        (answered, sent, seconds), beside = asyncio.run(probe())
        refused = _refused(url, tokens, "headers_too_large")

    assert answered.startswith(b"HTTP/1.1 431") or answered == b""
    assert sent < 8 * MIB
    assert seconds < 5
    assert beside == 200
    assert refused == 1
