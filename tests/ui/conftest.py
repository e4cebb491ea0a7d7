"""The dashboard in a real headless Chromium (Debian's `chromium` driven through its `chromedriver` by
Selenium; no browser is downloaded), against real `python -m timekeeper` processes on the real PostgreSQL.

Each system is a timekeeper on a database of its own, its clock fixed mid-month (a speed-1 demo clock) so
the seeded usage always falls in the current period, seeded through the API the way sidecars and admins do.
The tests (marked `browser`) skip, saying why, only when Chromium or its driver is not installed
(`apt-get install chromium chromium-driver`; `make test` installs both as root, hack/test-deps.sh).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.engine import URL

from tests.support.processes import LOCAL_HTTP, TimekeeperProcess, free_port
from tests.support.timekeeper import Tokens, bearer, migrated_database, report_body

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
WHY_SKIPPED = "needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver)"

# Mid-month, mid-week: the seeded hours before it all lie in the current monthly period.
NOW = datetime(2026, 3, 18, 12, 0, tzinfo=UTC)


@dataclass
class System:
    """A running timekeeper and the tokens it accepts."""

    url: str
    tokens: Tokens

    def api(self, method: str, path: str, token: str | None = None, **kwargs: Any) -> Any:
        response = LOCAL_HTTP.request(
            method,
            f"{self.url}/api/v1{path}",
            headers=bearer(token or self.tokens.admin),
            timeout=30,
            **kwargs,
        )
        assert response.is_success, f"{method} {path}: {response.status_code} {response.text}"
        return response.json()

    def budget(self, namespace: str) -> dict[str, Any]:
        return self.api("GET", f"/namespaces/{namespace}/budget", self.tokens.reader)  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def ui_tokens() -> Tokens:
    return Tokens()


def _start(name: str, tokens: Tokens, tmp: Path) -> Iterator[System]:
    with migrated_database(f"gtk_ui_{name}") as database:
        yield from _serve(database, name, tokens, tmp)


def _serve(database: URL, name: str, tokens: Tokens, tmp: Path) -> Iterator[System]:
    env = tokens.env() | {
        "TIMEKEEPER_SCHEDULER_ENABLED": "false",
        "TIMEKEEPER_CLOCK_START": NOW.isoformat(),
        "TIMEKEEPER_CLOCK_ORIGIN": f"{time.time():.6f}",
    }
    process = TimekeeperProcess(database, env, free_port(), tmp / f"timekeeper-{name}.log")
    process.start()
    try:
        yield System(process.url, tokens)
    finally:
        process.stop()


def report_hours(system: System, namespace: str, pod: str, hours: list[int], share: float) -> None:
    """One report per hour `h` (the hour ending h hours before NOW), as the pod's sidecar sends them."""
    for seq, ago in enumerate(hours):
        body = report_body(
            namespace=namespace,
            pod=pod,
            pod_uid=f"uid-{namespace}-{pod}",
            seq=seq,
            start=NOW - timedelta(hours=ago + 1),
            minutes=60,
            gpu_share=share,
        )
        system.api("POST", "/reports", system.tokens.reporter, json=body)


# The small system's namespaces: name -> (budget, [(pod, hours ago, share)]), and the state that follows.
SEEDED = {
    # 360 GPU-minutes used of 200: exhausted
    "team-alpha": (200, [("trainer-0", list(range(4, 8)), 1.0), ("trainer-1", list(range(20, 24)), 0.5)]),
    # 360 of 400 (warn at 80 %): warning
    "team-beta": (400, [("etl-0", list(range(2, 8)), 1.0)]),
    # 60 of 1,000: in budget
    "team-gamma": (1000, [("notebook-0", [3], 1.0)]),
    # no budget of its own, the default unlimited
    "team-delta": (None, [("sweep-0", [1, 2], 0.25)]),
}
STATES = {
    "team-alpha": "exhausted",
    "team-beta": "warning",
    "team-gamma": "in_budget",
    "team-delta": "unlimited",
}


@pytest.fixture(scope="session")
def system(ui_tokens: Tokens, tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    for started in _start("small", ui_tokens, tmp_path_factory.mktemp("ui")):
        for namespace, (budget, pods) in SEEDED.items():
            if budget is not None:
                started.api("PUT", f"/namespaces/{namespace}/budget", json={"budget_gpu_minutes": budget})
            for pod, hours, share in pods:
                report_hours(started, namespace, pod, hours, share)
        yield started


LARGE = 1000


async def _seed_many(system: System) -> None:
    """LARGE namespaces with budgets through the API, a few at a time; every fifth has a grant."""
    limit = asyncio.Semaphore(8)
    async with httpx.AsyncClient(
        base_url=f"{system.url}/api/v1", headers=bearer(system.tokens.admin), timeout=60
    ) as client:

        async def one(i: int) -> None:
            async with limit:
                namespace = f"ns-{i:04d}"
                response = await client.put(
                    f"/namespaces/{namespace}/budget", json={"budget_gpu_minutes": i % 7 * 100}
                )
                assert response.status_code == 200, response.text
                if i % 5 == 0:
                    granted = await client.post(
                        f"/namespaces/{namespace}/grants", json={"gpu_minutes": 50, "reason": "seed"}
                    )
                    assert granted.status_code == 201, granted.text

        await asyncio.gather(*(one(i) for i in range(LARGE)))


class _Seeding:
    """The large system started and seeded in a thread of its own, while the layer's other tests run."""

    def __init__(self, tokens: Tokens, folder: Path) -> None:
        self._running = ExitStack()
        # Migrated here: alembic's command API is not for two threads at once.
        database = self._running.enter_context(migrated_database("gtk_ui_large"))
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ui-large-system")
        self._seeded = self._thread.submit(self._seed, database, tokens, folder)

    def _seed(self, database: URL, tokens: Tokens, folder: Path) -> System:
        started = self._running.enter_context(contextmanager(_serve)(database, "large", tokens, folder))
        asyncio.run(_seed_many(started))
        return started

    def system(self) -> System:
        return self._seeded.result()

    def close(self) -> None:
        self._thread.shutdown(wait=True)
        self._running.close()


SEEDING = pytest.StashKey[_Seeding | None]()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """At the layer's first test, when a selected test asks for `large_system`, its seeding starts."""
    if SEEDING in item.config.stash:
        return
    wanted = (
        CHROMIUM
        and CHROMEDRIVER
        and any("large_system" in getattr(other, "fixturenames", ()) for other in item.session.items)
    )
    # tmp_path_factory's own object (the fixture answers the same), for the usual kept folders.
    factory: pytest.TempPathFactory = item.config._tmp_path_factory  # type: ignore[attr-defined]
    item.config.stash[SEEDING] = _Seeding(Tokens(), factory.mktemp("ui-large")) if wanted else None


def pytest_sessionfinish(session: pytest.Session) -> None:
    if (seeding := session.config.stash.get(SEEDING, None)) is not None:
        seeding.close()


@pytest.fixture(scope="session")
def large_system(request: pytest.FixtureRequest) -> System:
    """LARGE namespaces, seeded since the layer's first test (pytest_runtest_setup)."""
    seeding = request.config.stash[SEEDING]
    assert seeding is not None
    return seeding.system()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1440,900",  # a laptop screen
        "--lang=en-GB",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
