"""Requests sized before they are expanded (issue #38, points 4 and 5), against `python -m timekeeper`: the
chargeback export over year 1 to 9999 (monthly and daily) and over 1970 to 8999 daily, and a report body
nested 1,000 deep, each answered with its status and time; a report sent beside them, against one at rest."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable

import httpx

from bench.common import REPO_ROOT, Figure, Section, write_results
from bench.hostile import _report_ms
from bench.ingest import timekeeper
from tests.support.timekeeper import bearer

OUT = REPO_ROOT / "bench" / "out" / "ranges.md"
RANGES = {
    "chargeback, year 1 to 9999, monthly": ("0001-01-01T00:00:00Z", "9999-12-31T00:00:00Z", "monthly"),
    "chargeback, year 1 to 9999, daily": ("0001-01-01T00:00:00Z", "9999-12-31T00:00:00Z", "daily"),
    "chargeback, 1970 to 8999, daily": ("1970-01-01T00:00:00Z", "8999-12-31T00:00:00Z", "daily"),
}
DEEP = b"[" * 1_000 + b"]" * 1_000


async def _timed(request: Awaitable[httpx.Response]) -> tuple[str, float]:
    """What the request was answered (a status, or the error of a connection closed without one), and when."""
    started = time.perf_counter()
    try:
        answer = str((await request).status_code)
    except httpx.TransportError as error:
        answer = type(error).__name__
    return answer, (time.perf_counter() - started) * 1000


def _requests(client: httpx.AsyncClient, reporter: str, reader: str) -> dict[str, Awaitable[httpx.Response]]:
    """The four requests, by name, not yet sent."""
    asked: dict[str, Awaitable[httpx.Response]] = {
        name: client.get(
            "/billing/chargeback",
            params={"since": since, "until": until, "period": period},
            headers=bearer(reader),
        )
        for name, (since, until, period) in RANGES.items()
    }
    asked["report body nested 1,000 deep"] = client.post(
        "/reports", content=DEEP, headers={**bearer(reporter), "Content-Type": "application/json"}
    )
    return asked


async def _probe(url: str, reporter: str, reader: str, section: Section) -> None:
    at_rest = [await _report_ms(url, reporter, f"rest-{i}") for i in range(20)]
    async with httpx.AsyncClient(base_url=f"{url}/api/v1", timeout=120) as client:
        await client.get("/healthz")  # the connection is made before anything is timed
        for name, request in _requests(client, reporter, reader).items():
            status, ms = await _timed(request)
            section.figures.append(
                Figure(f"{name}: answered {status} after", ms, "ms", target="4xx, < 1,000 ms")
            )
        together = asyncio.gather(*map(_timed, _requests(client, reporter, reader).values()))
        await asyncio.sleep(0.01)  # they are sent; a report goes beside them
        started = time.perf_counter()
        try:
            beside = await _report_ms(url, reporter, "beside")
        except httpx.TimeoutException:
            beside = (time.perf_counter() - started) * 1000
            section.notes.append("the report beside them was not answered before its client's timeout")
        await together
    section.figures.append(
        Figure(
            "a report sent while all four are asked at once",
            beside,
            "ms",
            target="< 1,000 ms",
            baseline=max(at_rest),
            baseline_name="the slowest of 20 reports at rest",
        )
    )


def run() -> Section:
    section = Section("Requests sized before they are expanded (issue #38)")
    with timekeeper() as server:
        asyncio.run(_probe(server.url, server.token, server.reader, section))
    section.notes.append(
        "each request once on a connection already made, then all four at once and a report on a"
        " connection of its own beside them;"
        f" 1-minute load average: {os.getloadavg()[0]:.2f} (a shared 2-core machine)"
    )
    return section


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    write_results([run()], OUT)
    print(OUT.read_text())


if __name__ == "__main__":
    main()
