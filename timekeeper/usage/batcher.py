"""Group commit for report ingest: the reports that arrive while a transaction is committing are charged
together in the next one, and each is answered only after the commit that made its charge durable.

One commit (and a handful of set-based statements) per batch instead of several round trips and a commit
per report is what lets one timekeeper acknowledge thousands of reports a second. A batch holds at most
one report per pod (a pod's second report waits for the next batch, so it sees the first one's coverage).

Two batches may be in flight, but only one is gathered and charged at a time: a runner takes the charging
lock, takes the queued reports, charges them and releases the lock when its statements are written, so the
next batch is gathered and charged while this one commits, and a report that arrives meanwhile waits for
that next batch, not for a commit. Without the lock the runners would split the waiting reports into small
batches, and a batch costs much the same whatever its size (docs/performance.md).

A failed batch is logged and counted. When the database refused it (a single report's data, say; the
validation in front is meant to stop such reports before they get here), each report is charged again on
its own, so a bad report fails only itself and costs the others one retry. When the database does not
answer (an outage), every report of the batch is answered 503 with Retry-After at once: retrying them one
by one would only multiply the failing round trips.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from decimal import Decimal

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from timekeeper.clock import Clock
from timekeeper.db.outage import is_outage
from timekeeper.db.session import transaction
from timekeeper.errors import TimekeeperError
from timekeeper.metrics import Metrics
from timekeeper.refusals import unavailable
from timekeeper.settings import Settings
from timekeeper.usage.schemas import ReportIn
from timekeeper.usage.service import IngestOutcome, IngestService

# A report, the admitted share its pod was read at (None: the pods table's), and its answer.
Pending = tuple[ReportIn, Decimal | None, "asyncio.Future[IngestOutcome]"]
log = logging.getLogger(__name__)


class IngestBatcher:
    def __init__(
        self,
        sessions: Callable[[], async_sessionmaker[AsyncSession]],
        settings: Settings,
        clock: Clock,
        metrics: Metrics,
        max_batch: int = 500,
        in_flight: int = 2,
    ) -> None:
        """`sessions` is looked up for every batch (tests swap the app's sessionmaker after startup).
        `in_flight` batches run at once, one gathering and charging (holding the charging lock), the others
        committing."""
        self._sessions = sessions
        self._settings = settings
        self._clock = clock
        self._metrics = metrics
        self._max_batch = max_batch
        self._in_flight = in_flight
        self._queue: deque[Pending] = deque()
        self._arrived = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._charging: dict[int, list[Pending]] = {}
        self._charging_lock = asyncio.Lock()

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._run(runner), name=f"ingest-batcher-{runner}")
            for runner in range(self._in_flight)
        ]

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with suppress(asyncio.CancelledError):
                await task
        charging = [pending for batch in self._charging.values() for pending in batch]
        for _, _, future in [*charging, *self._queue]:
            if not future.done():
                future.set_exception(TimekeeperError("the timekeeper is shutting down", 503))

    async def submit(self, report: ReportIn, admitted_share: Decimal | None = None) -> IngestOutcome:
        """Answers once the report's charge is committed (or raises what refused it); `admitted_share`:
        the share its pod was admitted at, read from the pod (IngestService.charge's `admitted`)."""
        future: asyncio.Future[IngestOutcome] = asyncio.get_running_loop().create_future()
        self._queue.append((report, admitted_share, future))
        self._arrived.set()
        return await future

    def _take(self) -> list[Pending]:
        """The next batch: queued reports in arrival order, one per pod, up to max_batch."""
        batch: list[Pending] = []
        pods: set[str] = set()
        deferred: list[Pending] = []
        while self._queue and len(batch) < self._max_batch:
            pending = self._queue.popleft()
            if pending[2].done():  # its request was cancelled before the charge began
                continue
            if pending[0].pod_uid in pods:
                deferred.append(pending)
            else:
                pods.add(pending[0].pod_uid)
                batch.append(pending)
        self._queue.extendleft(reversed(deferred))
        return batch

    async def _run(self, runner: int) -> None:
        while True:
            if not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            await self._charging_lock.acquire()
            held = _HeldLock(self._charging_lock)
            try:
                batch = self._charging[runner] = self._take()
                if batch:
                    await self._charge(batch, held.release)
                del self._charging[runner]
            finally:
                held.release()

    async def _charge(self, batch: list[Pending], charged: Callable[[], None] = lambda: None) -> None:
        """Charges the batch and answers its reports; `charged` is called once its statements are written
        (before the commit) or it failed."""
        outcomes: list[IngestOutcome | Exception]
        self._metrics.batch_size.observe(len(batch))
        try:
            async with transaction(self._sessions()) as session:
                outcomes = [
                    *await IngestService(session, self._settings).charge(
                        [report for report, _, _ in batch],
                        self._clock.now(),
                        admitted={report.pod_uid: share for report, share, _ in batch if share is not None},
                    )
                ]
                charged()  # the commit is all that is left: the next batch may be gathered and charged
        except Exception as error:
            charged()
            outage = is_outage(error)
            self._metrics.batch_failures.labels(reason="outage" if outage else "refused").inc()
            if outage:  # logged once per outage, by timekeeper.db.outage.OutageWatch
                outcomes = [unavailable() for _ in batch]
            elif len(batch) > 1:
                log.warning("ingest_batch_failed", extra={"reports": len(batch), "error": repr(error)})
                for pending in batch:
                    await self._charge([pending])
                return
            else:
                report = batch[0][0]
                log.warning(
                    "report_ingest_failed",
                    extra={"namespace": report.namespace, "pod": report.pod, "error": repr(error)},
                )
                outcomes = [error]
        for (_, _, future), outcome in zip(batch, outcomes, strict=True):
            if future.done():
                continue
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)


class _HeldLock:
    """The charging lock as one runner holds it: released once, by whichever comes first."""

    __slots__ = ("_lock",)

    def __init__(self, lock: asyncio.Lock) -> None:
        self._lock: asyncio.Lock | None = lock

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
