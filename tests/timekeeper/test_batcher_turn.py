"""The charging lock: two batches in flight, one gathered and charged at a time. A batch's reports are
those that arrived while the previous one charged (not a share of them split between two runners), and
the next batch still charges while the previous one commits. The database is stood in for, so each step
happens when the test says (what a batch charges is tests/timekeeper/test_group_commit.py's)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from datetime import datetime, timedelta
from decimal import Decimal

import pytest

from tests.support.timekeeper import report_body
from tests.timekeeper.conftest import START
from timekeeper.clock import ManualClock
from timekeeper.metrics import Metrics
from timekeeper.settings import Settings
from timekeeper.usage import batcher as batcher_module
from timekeeper.usage.batcher import IngestBatcher
from timekeeper.usage.schemas import ReportIn
from timekeeper.usage.service import IngestOutcome

pytestmark = pytest.mark.asyncio(loop_scope="session")


def report(pod_uid: str) -> ReportIn:
    return ReportIn.model_validate(
        report_body(pod_uid=pod_uid, start=START - timedelta(hours=1), minutes=1, gpu_share=1)
    )


class Steps:
    """What the stand-in database is doing: the batches charged so far (pod uids, in order), how many
    charge at once, and a gate per batch for its charge and its commit (open when the test says)."""

    def __init__(self) -> None:
        self.charged: list[list[str]] = []
        self.charging = 0
        self.most_charging = 0
        self.commits_done = 0
        self.started = asyncio.Condition()
        self.charge_gates: list[asyncio.Event] = [asyncio.Event() for _ in range(4)]
        self.commit_gates: list[asyncio.Event] = [asyncio.Event() for _ in range(4)]

    async def batches_started(self, count: int) -> None:
        async with self.started:
            await asyncio.wait_for(self.started.wait_for(lambda: len(self.charged) >= count), 10)


class Session:
    def __init__(self, steps: Steps) -> None:
        self.steps = steps
        self.batch = -1

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *_: object) -> None:
        return None

    async def commit(self) -> None:
        await self.steps.commit_gates[self.batch].wait()
        self.steps.commits_done += 1

    async def rollback(self) -> None:
        return None


class Sessions:
    """A sessionmaker: each batch opens a session of it."""

    def __init__(self, steps: Steps) -> None:
        self.steps = steps

    def __call__(self) -> Session:
        return Session(self.steps)


def charging_service(steps: Steps) -> type:
    class Service:
        def __init__(self, session: Session, _settings: Settings) -> None:
            self.session = session

        async def charge(
            self, reports: Sequence[ReportIn], _now: datetime, **_: object
        ) -> list[IngestOutcome]:
            self.session.batch = len(steps.charged)
            steps.charging += 1
            steps.most_charging = max(steps.most_charging, steps.charging)
            async with steps.started:
                steps.charged.append([r.pod_uid for r in reports])
                steps.started.notify_all()
            await steps.charge_gates[self.session.batch].wait()
            steps.charging -= 1
            return [IngestOutcome(False, Decimal(1), "in_budget") for _ in reports]

    return Service


@pytest.fixture
async def steps(monkeypatch: pytest.MonkeyPatch) -> Steps:
    steps = Steps()
    monkeypatch.setattr(batcher_module, "IngestService", charging_service(steps))
    return steps


@pytest.fixture
async def batcher(steps: Steps, settings: Settings, clock: ManualClock) -> AsyncIterator[IngestBatcher]:
    sessions = Sessions(steps)
    batcher = IngestBatcher(lambda: sessions, settings, clock, Metrics(), in_flight=2)  # type: ignore[arg-type,return-value]
    batcher.start()
    yield batcher
    for gate in [*steps.charge_gates, *steps.commit_gates]:
        gate.set()
    await batcher.aclose()


async def settle() -> None:
    """Lets every task that can run, run (nothing here waits on anything but the gates)."""
    for _ in range(50):
        await asyncio.sleep(0)


async def test_one_batch_charges_at_a_time_and_the_next_charges_while_it_commits(
    batcher: IngestBatcher, steps: Steps
) -> None:
    first = [asyncio.ensure_future(batcher.submit(report(f"uid-{i}"))) for i in range(3)]
    await steps.batches_started(1)
    # Arriving while the first batch charges: the other runner is free, but waits for the charging lock.
    second = [asyncio.ensure_future(batcher.submit(report(f"uid-{i}"))) for i in range(3, 6)]
    await settle()
    assert steps.charged == [["uid-0", "uid-1", "uid-2"]]

    steps.charge_gates[0].set()  # the first batch's statements are written; its commit has not returned
    await steps.batches_started(2)
    await settle()
    assert steps.charged == [["uid-0", "uid-1", "uid-2"], ["uid-3", "uid-4", "uid-5"]]
    assert steps.commits_done == 0 and not any(future.done() for future in first)

    steps.commit_gates[0].set()
    await asyncio.wait_for(asyncio.gather(*first), 10)
    assert not any(future.done() for future in second)
    steps.charge_gates[1].set()
    steps.commit_gates[1].set()
    await asyncio.wait_for(asyncio.gather(*second), 10)
    assert steps.most_charging == 1
