"""The accounting chaos run's parts, shared by the single-cluster test (tests/chaos/test_accounting.py,
static tokens) and the fleet's (tests/cluster/test_fleet_chaos.py, each pod's own token and cluster):
simulated pods whose ground truth is known, their sidecars under a hostile network, the disruptions, and
what happened.

Ground truth: each pod runs for `run.intervals` contiguous intervals of `run.interval` at its fixed share
and, like the sidecar, retries every report until it is acknowledged, so it is charged share x the run's
length. Re-sends under new sequence numbers (a sidecar that lost its numbering) span time already
reported; they may charge what has not been charged yet, never anything twice, so the union of a pod's
intervals is still the whole run.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path

import httpx
from sqlalchemy.engine import make_url

from tests.support.postgres import REPO_ROOT
from tests.support.throwaway_postgres import ThrowawayPostgres, throwaway_postgres
from tests.support.timekeeper import migrate, ok, report_body

# Fractions of the pods' acknowledged reports at which each disruption strikes, in this order.
DISRUPTIONS = (0.15, 0.35, 0.55, 0.75)
# Sequence numbers from here on are re-sends of time already reported, under numbers of their own.
RESENT_FROM = 1000


@dataclass(frozen=True)
class Run:
    """The time every pod runs: `intervals` contiguous intervals of `interval` (whole seconds) from
    `start`."""

    start: datetime
    interval: timedelta
    intervals: int

    @property
    def seconds(self) -> int:
        """The whole run's length, in seconds."""
        return self.intervals * int(self.interval.total_seconds())

    @property
    def end(self) -> datetime:
        return self.start + self.intervals * self.interval


@dataclass
class Pod:
    """A simulated pod: its identity as its reports name it, the headers its sidecar reports with (its
    token, and in a fleet its cluster), its share and GPU model, the share its reports state where they lie
    about it, and the reports it has still to deliver."""

    namespace: str
    name: str
    uid: str
    share: Decimal
    run: Run
    headers: dict[str, str]
    model: str | None = None
    stated_share: Decimal | None = None  # None: its reports state its share
    pending: list[tuple[int, int, int]] = field(default_factory=list)  # (seq, first, last interval)
    acknowledged: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.pending = [(seq, seq, seq) for seq in range(self.run.intervals)]

    @property
    def truth(self) -> Decimal:
        """GPU-minutes: the share over the union of the intervals it reports (the whole run)."""
        return self.share * Decimal(self.run.seconds) / 60

    def body(self, seq: int, first: int, last: int) -> dict[str, object]:
        return report_body(
            namespace=self.namespace,
            pod=self.name,
            pod_uid=self.uid,
            seq=seq,
            start=self.run.start + first * self.run.interval,
            end=self.run.start + (last + 1) * self.run.interval,
            gpu_share=float(self.share if self.stated_share is None else self.stated_share),
            gpus=[
                {"uuid": "GPU-0", "sm_util_pct": 50.0, "mem_used_bytes": 1, "mem_total_bytes": 2}
                | ({"name": self.model} if self.model else {})
            ],
        )


def truth_by(pods: list[Pod], key: Callable[[Pod], str]) -> dict[str, Decimal]:
    """Each key's ground truth in GPU-minutes: the sum of its pods'."""
    sums: dict[str, Decimal] = {}
    for pod in pods:
        sums[key(pod)] = sums.get(key(pod), Decimal(0)) + pod.truth
    return sums


@dataclass
class Tally:
    """What happened, so the test can show the chaos really took place."""

    acknowledged: int = 0
    duplicates: int = 0
    failures: int = 0
    dropped: int = 0
    disruptions: list[str] = field(default_factory=list)
    progress: asyncio.Condition = field(default_factory=asyncio.Condition)


@contextmanager
def migrated_throwaway() -> Iterator[ThrowawayPostgres]:
    """A PostgreSQL server of the test's own, to crash at will, migrated to head."""
    with throwaway_postgres() as server:
        migrate(make_url(server.url))
        yield server


class TimekeeperProcess:
    """`python -m timekeeper` on a fixed port, killed with SIGKILL and started again at will."""

    def __init__(self, port: int, env: dict[str, str], log: Path) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.env = {**os.environ, **env}
        self.log = log
        self.child: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        args = ["-m", "timekeeper", "--port", str(self.port), "--log-level", "warning"]
        with self.log.open("ab") as log:
            self.child = await asyncio.create_subprocess_exec(
                sys.executable, *args, cwd=REPO_ROOT, env=self.env, stdout=log, stderr=log
            )
        for _ in range(1200):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                return
            except OSError:
                assert self.child.returncode is None, f"timekeeper exited: {self.log.read_text()[-2000:]}"
                await asyncio.sleep(0.05)
        raise TimeoutError("timekeeper did not start listening")

    async def kill(self) -> None:
        if self.child is not None and self.child.returncode is None:
            self.child.kill()
            await self.child.wait()


async def _send(client: httpx.AsyncClient, pod: Pod, body: dict[str, object], tally: Tally) -> bool:
    """One attempt: True when acknowledged. A refused connection or a 5xx is an outage to retry
    through; any other answer is a bug in the timekeeper."""
    try:
        response = await client.post("/api/v1/reports", json=body, headers=pod.headers)
    except httpx.TransportError:
        tally.failures += 1
        return False
    if response.status_code >= 500:
        tally.failures += 1
        return False
    ack = ok(response)
    tally.duplicates += ack["duplicate"]
    return True


async def report(pod: Pod, client: httpx.AsyncClient, rng: random.Random, tally: Tally) -> None:
    """The pod's sidecar under a hostile network: picks any pending report (reordering), waits a while
    (delay), sometimes never sends it (dropped, retried later) or sends it twice at once (duplicated);
    after an acknowledgement it sometimes re-sends time already reported under a new sequence number."""
    next_seq = RESENT_FROM
    intervals = pod.run.intervals
    while pod.pending:
        seq, first, last = rng.choice(pod.pending)
        await asyncio.sleep(rng.uniform(0, 0.1))
        roll = rng.random()
        if roll < 0.15:
            tally.dropped += 1
            continue
        copies = 2 if roll > 0.85 else 1
        body = pod.body(seq, first, last)
        results = await asyncio.gather(*(_send(client, pod, body, tally) for _ in range(copies)))
        if not any(results):
            await asyncio.sleep(rng.uniform(0.05, 0.2))
            continue
        pod.pending.remove((seq, first, last))
        pod.acknowledged.add(seq)
        if seq < RESENT_FROM:
            tally.acknowledged += 1
            async with tally.progress:
                tally.progress.notify_all()
        if rng.random() < 0.1:
            span_first = rng.randrange(intervals)
            span_last = min(intervals - 1, span_first + rng.randrange(3))
            pod.pending.append((next_seq, span_first, span_last))
            next_seq += 1


async def disrupt(
    tally: Tally, total: int, timekeeper: TimekeeperProcess, postgres: ThrowawayPostgres
) -> None:
    """At each of DISRUPTIONS' fractions of `total` acknowledged reports: the timekeeper killed -9 and
    restarted, PostgreSQL crashed and restarted, both at once, and PostgreSQL again."""

    async def kill_timekeeper() -> None:
        await timekeeper.kill()
        await asyncio.sleep(0.3)
        await timekeeper.start()

    async def restart_postgres() -> None:
        await asyncio.to_thread(postgres.restart)

    async def both() -> None:
        await timekeeper.kill()
        await restart_postgres()
        await timekeeper.start()

    steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
        ("timekeeper killed -9 and restarted", kill_timekeeper),
        ("PostgreSQL crashed (immediate) and restarted", restart_postgres),
        ("timekeeper killed, PostgreSQL crashed, both restarted", both),
        ("PostgreSQL crashed (immediate) and restarted", restart_postgres),
    ]
    for fraction, (name, step) in zip(DISRUPTIONS, steps, strict=True):
        async with tally.progress:
            await tally.progress.wait_for(lambda fraction=fraction: tally.acknowledged >= fraction * total)
        await step()
        tally.disruptions.append(f"{name} at {tally.acknowledged}/{total}")


async def chaos(
    pods: list[Pod],
    client: httpx.AsyncClient,
    timekeeper: TimekeeperProcess,
    postgres: ThrowawayPostgres,
    seed: int,
) -> Tally:
    """Every pod reports its whole run through the hostile network while the disruptions strike; answers
    what happened once every report is acknowledged."""
    tally = Tally()
    rng = random.Random(seed)
    total = sum(pod.run.intervals for pod in pods)
    await asyncio.gather(
        *(report(pod, client, random.Random(rng.random()), tally) for pod in pods),
        disrupt(tally, total, timekeeper, postgres),
    )
    return tally


def assert_chaos_happened(tally: Tally) -> None:
    """Every disruption struck, and reports were dropped, duplicated and failed."""
    assert len(tally.disruptions) == len(DISRUPTIONS), tally
    assert tally.dropped and tally.duplicates and tally.failures, tally
