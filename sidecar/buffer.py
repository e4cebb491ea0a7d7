"""Reports waiting for acknowledgement, one JSON file each on the emptyDir, bounded by count, bytes and age:
over a bound the oldest contiguous reports fold into one (a fresh sequence number); a report is dropped,
counted and logged only when nothing can fold (docs/sidecar.md)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from gpuaccounting.clock import from_datetime, to_datetime
from gpuaccounting.wire import Report, build_report, parse_timestamp
from sidecar.aggregate import merge_measurements
from sidecar.logs import EventLog
from sidecar.progress import atomic_write

SUFFIX = ".json"


@dataclass(frozen=True, slots=True)
class Pending:
    """What the buffer keeps in memory about a stored report; the body stays on disk."""

    seq: int
    start_us: int
    end_us: int
    size: int
    path: Path

    @property
    def seconds(self) -> float:
        return (self.end_us - self.start_us) / 1e6


def report_bounds(report: Report) -> tuple[int, int]:
    return (
        from_datetime(parse_timestamp(report["interval_start"])),
        from_datetime(parse_timestamp(report["interval_end"])),
    )


class ReportBuffer:
    """Pending reports ordered by interval start; safe to use from the loop and the sender thread."""

    def __init__(
        self,
        directory: Path,
        *,
        max_reports: int,
        max_bytes: int,
        max_age_us: int,
        max_interval_us: int,
        allocate_seq: Callable[[], int],
        record_drop: Callable[[float], tuple[int, float]],
        log: EventLog,
    ) -> None:
        self._dir = directory
        self._max_reports = max_reports
        self._max_bytes = max_bytes
        self._max_age_us = max_age_us
        self._max_interval_us = max_interval_us
        self._allocate_seq = allocate_seq
        self._record_drop = record_drop
        self._log = log
        self._lock = threading.Lock()
        self._pending: list[Pending] = []
        # While the buffer stays full every new report causes a fold: say so once, not once per report.
        self._folding_announced = False
        directory.mkdir(parents=True, exist_ok=True)

    def _path(self, seq: int) -> Path:
        return self._dir / f"report-{seq:012d}{SUFFIX}"

    def load(self) -> list[Pending]:
        """Read what a previous run left behind, removing reports wholly inside another (an interrupted fold)
        and writes a kill cut short (never stored: the state did not move past them, so they are cut
        again)."""
        for partial in self._dir.glob(f".report-*{SUFFIX}.tmp"):
            partial.unlink(missing_ok=True)
        found: list[Pending] = []
        for path in self._dir.glob(f"report-*{SUFFIX}"):
            try:
                report = cast(Report, json.loads(path.read_bytes()))
                start, end = report_bounds(report)
                found.append(Pending(report["seq"], start, end, path.stat().st_size, path))
            except (OSError, ValueError, KeyError, TypeError):
                self._log.warning("buffer_file_unreadable", file=path.name)
                path.unlink(missing_ok=True)
        kept = [
            p
            for p in found
            if not any(
                o is not p and o.start_us <= p.start_us and p.end_us <= o.end_us and o.seq > p.seq
                for o in found
            )
        ]
        for pending in set(found) - set(kept):
            pending.path.unlink(missing_ok=True)
        with self._lock:
            self._pending = sorted(kept, key=lambda p: (p.start_us, p.seq))
            return list(self._pending)

    def store(self, report: Report) -> Pending:
        """Write a report to disk (not yet visible to the sender: see `admit`)."""
        path = self._path(report["seq"])
        data = json.dumps(report, separators=(",", ":")).encode()
        atomic_write(path, data)
        start, end = report_bounds(report)
        return Pending(report["seq"], start, end, len(data), path)

    def admit(self, pending: Pending, now_us: int) -> None:
        """Hand a stored report to the sender, then bring the buffer back within its bounds."""
        with self._lock:
            self._pending.append(pending)
            self._pending.sort(key=lambda p: (p.start_us, p.seq))
            self._enforce_bounds(now_us)

    def read(self, pending: Pending) -> Report | None:
        try:
            return cast(Report, json.loads(pending.path.read_bytes()))
        except (OSError, ValueError):
            return None

    def oldest(self) -> Pending | None:
        with self._lock:
            return self._pending[0] if self._pending else None

    def remove(self, pending: Pending) -> bool:
        """Forget an acknowledged (or given-up) report; answers False (and does nothing) when a fold has
        already absorbed it, so its time is still pending in the fold."""
        with self._lock:
            present = pending in self._pending
            if present:
                self._pending.remove(pending)
                pending.path.unlink(missing_ok=True)
            if not self._pending:
                self._folding_announced = False
            return present

    def replace(self, pending: Pending, report: Report) -> Pending | None:
        """Rewrite a pending report's body (same sequence number); None if a fold absorbed it meanwhile."""
        with self._lock:
            if pending not in self._pending:
                return None
            updated = self.store(report)
            self._pending[self._pending.index(pending)] = updated
            return updated

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    def pending_seconds(self) -> float:
        with self._lock:
            return sum(p.seconds for p in self._pending)

    def _over_size(self) -> bool:
        return len(self._pending) > self._max_reports or sum(p.size for p in self._pending) > self._max_bytes

    def _fold_candidate(self, older_than_us: int | None = None) -> int | None:
        """Index of the oldest pair of neighbours that may fold: contiguous, short enough together, and
        (for the age bound) both ending before `older_than_us`."""
        for index in range(len(self._pending) - 1):
            first, second = self._pending[index], self._pending[index + 1]
            if older_than_us is not None and second.end_us >= older_than_us:
                return None
            if first.end_us == second.start_us and second.end_us - first.start_us <= self._max_interval_us:
                return index
        return None

    def _enforce_bounds(self, now_us: int) -> None:
        while (index := self._fold_candidate(older_than_us=now_us - self._max_age_us)) is not None:
            self._fold(index)
        while len(self._pending) > 1 and self._over_size():
            index = self._fold_candidate()
            if index is None:
                self._drop(self._pending[0])
            else:
                self._fold(index)

    def _fold(self, index: int) -> None:
        first, second = self._pending[index], self._pending[index + 1]
        bodies = [self.read(first), self.read(second)]
        if bodies[0] is None or bodies[1] is None:
            self._drop(first if bodies[0] is None else second)
            return
        a, b = cast(Report, bodies[0]), cast(Report, bodies[1])
        merged = build_report(
            namespace=a["namespace"],
            pod=a["pod"],
            pod_uid=a["pod_uid"],
            seq=self._allocate_seq(),
            interval_start=to_datetime(first.start_us),
            interval_end=to_datetime(second.end_us),
            gpu_share=a["gpu_share"],
            gpus=merge_measurements(
                [(first.end_us - first.start_us, a["gpus"]), (second.end_us - second.start_us, b["gpus"])]
            ),
            final=a["final"] or b["final"],
        )
        # The merged report is on disk before its parts go: a crash in between leaves an overlap,
        # which `load` resolves and the timekeeper's per-pod coverage would never charge twice.
        folded = self.store(merged)
        self._pending[index : index + 2] = [folded]
        first.path.unlink(missing_ok=True)
        second.path.unlink(missing_ok=True)
        announce = self._log.debug if self._folding_announced else self._log.info
        self._folding_announced = True
        announce(
            "buffer_folded",
            seqs=[first.seq, second.seq],
            into_seq=folded.seq,
            interval_seconds=round(folded.seconds, 3),
            pending=len(self._pending),
        )

    def _drop(self, pending: Pending) -> None:
        self._pending.remove(pending)
        pending.path.unlink(missing_ok=True)
        total, seconds = self._record_drop(pending.seconds)
        self._log.error(
            "report_dropped",
            seq=pending.seq,
            reason="buffer full and nothing to fold",
            interval_seconds=round(pending.seconds, 3),
            dropped_reports_total=total,
            dropped_seconds_total=round(seconds, 3),
        )
