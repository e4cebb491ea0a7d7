"""Two real timekeeper processes on one PostgreSQL, reported to by many concurrent clients; the leader is
killed mid-run. The books stay exact, every job window runs once, and the survivor takes the jobs over."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

from gpuaccounting.clock import AcceleratedClock
from tests.support.postgres import url_string
from tests.support.replicas import Replica, scheduler_status, started_replicas, wait_for_leader
from tests.support.timekeeper import Tokens, bearer, migrated_database, report_body

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

PODS = 24
REPORTS_PER_POD = 40
SHARES = (Decimal(1), Decimal("0.5"), Decimal("0.25"), Decimal(2))
NAMESPACES = ("team-0", "team-1", "team-2", "team-3")
INTERVAL = timedelta(seconds=30)
# The replicas' clock: noon of a fixed day, running at real speed from the fixture's start. On the system
# clock a run that crossed 00:00 UTC gave the survivor a new day's roll-over to run ("ok", a second
# `rollover` row) and failed; twelve hours from midnight, no run does.
NOON = datetime(2026, 3, 18, 12, 0, tzinfo=UTC)


@pytest.fixture
def clock() -> AcceleratedClock:
    return AcceleratedClock(NOON, 1.0, time.time())


@pytest.fixture
def database() -> Iterator[URL]:
    with migrated_database("gtk_replicas") as url:
        yield url


@pytest.fixture
def replicas(
    database: URL, tokens: Tokens, tmp_path: Path, clock: AcceleratedClock
) -> Iterator[list[Replica]]:
    env = {
        **tokens.env(),
        "TIMEKEEPER_CLOCK_START": clock.start.isoformat(),
        "TIMEKEEPER_CLOCK_ORIGIN": f"{clock.real_origin:.6f}",
        "TIMEKEEPER_LEADER_RETRY_INTERVAL": "0.5",
        # A slow check on a loaded machine would hand leadership over before the kill; a killed leader's
        # session ends at once, whatever this timeout (docs/scheduler.md).
        "TIMEKEEPER_LEADER_CHECK_TIMEOUT": "10",
        "TIMEKEEPER_ROLLOVER_INTERVAL": "1",
        "TIMEKEEPER_STATES_INTERVAL": "1",
        "TIMEKEEPER_CLOSEOUT_INTERVAL": "1",
        # Roll-up windows every second and no raw rows: the history is the hourly aggregates alone.
        "TIMEKEEPER_ROLLUP_INTERVAL": "1",
        "TIMEKEEPER_PARTITIONS_INTERVAL": "1",
        "TIMEKEEPER_LEDGER_RETENTION": "0",
    }
    with started_replicas(database, env, tmp_path) as started:
        yield started


@dataclass
class Traffic:
    """Sidecar-like clients: each pod sends its numbered intervals in order to one replica or the other,
    retries on a connection error (at the other replica) and sometimes repeats a report elsewhere."""

    client: httpx.AsyncClient
    tokens: Tokens
    targets: list[Replica]
    base: datetime
    acknowledged: int = 0
    halfway: asyncio.Event = field(default_factory=asyncio.Event)

    def alive(self) -> list[Replica]:
        return [replica for replica in self.targets if replica.alive()]

    async def send(self, body: dict, prefer: int) -> None:
        for _ in range(50):
            targets = self.alive()
            target = targets[prefer % len(targets)]
            try:
                answer = await self.client.post(
                    f"{target.url}/api/v1/reports", json=body, headers=bearer(self.tokens.reporter)
                )
            except httpx.TransportError:
                prefer += 1
                continue
            if answer.status_code >= 500:
                prefer += 1
                continue
            assert answer.status_code == 200, answer.text
            return
        raise AssertionError("a report was never acknowledged")

    async def pod(self, number: int) -> None:
        rng = random.Random(number)
        start = self.base + timedelta(minutes=7 * number)  # pods straddle hour boundaries
        for seq in range(REPORTS_PER_POD):
            body = report_body(
                namespace=NAMESPACES[number % len(NAMESPACES)],
                pod=f"pod-{number}",
                pod_uid=f"uid-{number}",
                seq=seq,
                start=start + seq * INTERVAL,
                end=start + (seq + 1) * INTERVAL,
                gpu_share=float(SHARES[number % len(SHARES)]),
            )
            await self.send(body, rng.randrange(2))
            if rng.random() < 0.25:
                await self.send(body, rng.randrange(2))  # a retry, maybe at the other replica
            self.acknowledged += 1
            if self.acknowledged >= PODS * REPORTS_PER_POD // 2:
                self.halfway.set()


async def status_once_every_job_ran_since(
    client: httpx.AsyncClient, replica: Replica, since: datetime
) -> dict:
    """The replica's scheduler status as soon as each job has started a run after `since`."""
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        status = await scheduler_status(client, replica)
        if (
            status is not None
            and status["jobs"]
            and all(
                job["last_run"] is not None and datetime.fromisoformat(job["last_run"]) > since
                for job in status["jobs"].values()
            )
        ):
            return status
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not every job ran on {replica.name} after {since}: {status}")
        await asyncio.sleep(0.05)


def expected_totals() -> dict[str, Decimal]:
    totals = dict.fromkeys(NAMESPACES, Decimal(0))
    for number in range(PODS):
        minutes = Decimal(REPORTS_PER_POD) * Decimal(INTERVAL.total_seconds()) / 60
        totals[NAMESPACES[number % len(NAMESPACES)]] += SHARES[number % len(SHARES)] * minutes
    return totals


async def test_two_replicas_keep_exact_books_and_hand_the_jobs_over_when_the_leader_dies(
    database: URL, replicas: list[Replica], tokens: Tokens, clock: AcceleratedClock
) -> None:
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(timeout=10, limits=limits) as client:
        leader = await wait_for_leader(client, replicas)
        [survivor] = [replica for replica in replicas if replica is not leader]
        ok = await client.put(
            f"{survivor.url}/api/v1/namespaces/team-0/budget",
            json={"budget_gpu_minutes": 30, "period": "none"},
            headers=bearer(tokens.admin),
        )
        assert ok.status_code == 200, ok.text

        # Intervals of the last few hours: older than the (zero) retention, so rolled up as they land.
        now = clock.now()
        traffic = Traffic(
            client, tokens, replicas, now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=4)
        )
        pods = asyncio.gather(*(traffic.pod(number) for number in range(PODS)))
        await traffic.halfway.wait()
        leader.kill()
        killed_at = clock.now()  # compared with job_runs.ran_at: the replicas' clock
        await pods

        traffic_done = datetime.now(UTC)  # compared with /readyz's last_run: the process's own time
        assert await wait_for_leader(client, [survivor]) is survivor
        # The survivor runs every job once more after the last report (however loaded the machine is).
        status = await status_once_every_job_ran_since(client, survivor, traffic_done)
        assert {name: job["outcome"] for name, job in status["jobs"].items()} == {
            "rollover": "skipped",  # today's window ran on the first leader
            "states": "ok",
            "closeout": "ok",
            "rollup": "ok",
            "partitions": "ok",
        }
        metrics = (await client.get(f"{survivor.url}/metrics")).text
        assert f'timekeeper_scheduler_leader{{replica="{survivor.name}"}} 1.0' in metrics
        assert 'timekeeper_job_last_duration_seconds{job="rollup"}' in metrics

        usage = {}
        for group_by in ("pod", "hour", "day"):
            answer = await client.get(
                f"{survivor.url}/api/v1/namespaces/team-1/usage",
                params={
                    "since": (now - timedelta(days=1)).isoformat(),
                    "until": now.isoformat(),
                    "group_by": group_by,
                },
                headers=bearer(tokens.reader),
            )
            usage[group_by] = answer.json()["total_gpu_minutes"]

    engine = sa.create_engine(url_string(database), poolclass=sa.NullPool)
    with engine.connect() as connection:
        totals = dict(
            connection.execute(
                sa.text("SELECT namespace, sum(used_gpu_minutes) FROM usage_totals GROUP BY namespace")
            ).all()
        )
        runs = connection.execute(sa.text("SELECT job, window_start, replica, ran_at FROM job_runs")).all()
        raw_left = connection.execute(sa.text("SELECT count(*) FROM usage_ledger")).scalar_one()
        rolled = connection.execute(sa.text("SELECT count(*) FROM usage_pod_hours")).scalar_one()
        # Each report touched one hour (30-s intervals aligned to the hour): added once, it counts once.
        folded = connection.execute(
            sa.text(
                "SELECT c.pod_uid, sum(h.reports) AS reports, (SELECT sum(upper(r) - lower(r)) "
                "FROM unnest(range_agg(h.charged)) AS r) AS charged "
                "FROM usage_pod_hours h JOIN pod_coverage c ON c.id = h.pod_key GROUP BY c.pod_uid"
            )
        ).all()
        team_0_events = (
            connection.execute(
                sa.text("SELECT new_state FROM budget_events WHERE namespace = 'team-0' ORDER BY id")
            )
            .scalars()
            .all()
        )
    engine.dispose()

    expected = expected_totals()
    assert totals == expected  # exact, to the nano-GPU-minute, with retries, a kill and roll-ups
    assert set(usage.values()) == {float(expected["team-1"])}
    assert rolled > 0 and raw_left == 0
    assert {row.pod_uid: (row.reports, row.charged) for row in folded} == {
        f"uid-{number}": (REPORTS_PER_POD, REPORTS_PER_POD * INTERVAL) for number in range(PODS)
    }
    # One row per (job, window) is the table's key; who ran it shows one runner at a time.
    assert len({(job, window) for job, window, _, _ in runs}) == len(runs)
    by_replica = {
        replica: [ran_at for _, _, name, ran_at in runs if name == replica]
        for replica in {r[2] for r in runs}
    }
    assert set(by_replica) == {leader.name, survivor.name}
    assert max(by_replica[leader.name]) <= killed_at <= min(by_replica[survivor.name])
    assert [job for job, _, name, _ in runs if job == "rollover"] == ["rollover"]
    assert team_0_events[-1] == "exhausted"
