"""Group commit for report ingest: the reports that arrive while a transaction commits are charged
together in the next, each answered after the commit that made its charge durable; a batch holds at
most one report per pod. One batch is gathered and charged at a time (the charging lock), the next
while the previous commits. A batch the database refused is charged again report by report, so a bad
report fails only itself; in an outage every report of the batch is answered 503 at once."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from contextlib import suppress

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from timekeeper.clock import Clock
from timekeeper.db.outage import is_outage
from timekeeper.db.session import transaction
from timekeeper.errors import TimekeeperError
from timekeeper.metrics import Metrics
from timekeeper.refusals import unavailable
from timekeeper.settings import Settings
from timekeeper.usage.schemas import ReportIn
from timekeeper.usage.service import BatchEntry, IngestOutcome, IngestService, PodFacts

# A report, what was read of its pod from the cluster (None: the pods table's), and its answer.
Pending = tuple[ReportIn, PodFacts | None, "asyncio.Future[IngestOutcome]"]
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

    async def submit(self, report: ReportIn, pod: PodFacts | None = None) -> IngestOutcome:
        """Answers once the report's charge is committed (or raises what refused it); `pod`: the share
        its pod was admitted at and its node's model, read from the cluster (BatchEntry.of)."""
        future: asyncio.Future[IngestOutcome] = asyncio.get_running_loop().create_future()
        self._queue.append((report, pod, future))
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
            outcomes = await self._write(batch, charged)
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

    async def _write(
        self, batch: list[Pending], charged: Callable[[], None], *, again: bool = True
    ) -> list[IngestOutcome | Exception]:
        """The batch's charge in one transaction. One whose connection was lost before its COMMIT was sent
        committed nothing: it is written once more, on a connection made since (the pool replaced the older
        ones). One lost during the COMMIT may have landed: it fails (a 503; the sidecar's retry repeats)."""
        committing = False
        try:
            async with transaction(self._sessions()) as session:
                outcomes: list[IngestOutcome | Exception] = [
                    *await IngestService(session, self._settings).charge(
                        [BatchEntry.of(report, pod) for report, pod, _ in batch], self._clock.now()
                    )
                ]
                charged()  # the commit is all that is left: the next batch may be gathered and charged
                committing = True
        except sa.exc.DBAPIError as error:
            if committing or not again or not error.connection_invalidated:
                raise
            return await self._write(batch, charged, again=False)
        return outcomes


class _HeldLock:
    """The charging lock as one runner holds it: released once, by whichever comes first."""

    __slots__ = ("_lock",)

    def __init__(self, lock: asyncio.Lock) -> None:
        self._lock: asyncio.Lock | None = lock

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
