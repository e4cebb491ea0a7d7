"""The sidecar's persistent state on its emptyDir (the grid's anchor, the time covered, the next sequence
number, what was dropped), written atomically so a kill at any instant leaves the old state or the new."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

STATE_VERSION = 1


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new content."""
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


@dataclass(slots=True)
class Progress:
    """`anchor_us` is the sidecar's first start; reported time is [anchor_us, covered_until_us). Times are
    integer microseconds since the Unix epoch on the sidecar's clock (simulated under an accelerated one)."""

    pod_uid: str
    anchor_us: int
    covered_until_us: int
    next_seq: int = 1
    dropped_reports: int = 0
    dropped_seconds: float = 0.0
    version: int = STATE_VERSION


class ProgressStore:
    """The state file plus the lock that both the sampling loop and the sender take to change it."""

    def __init__(self, path: Path, state: Progress) -> None:
        self.path = path
        self.state = state
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: Path, pod_uid: str, start_us: int) -> tuple[ProgressStore, bool]:
        """Load the state, or start a new one anchored at `start_us`; answers whether it was resumed.

        A state written for another pod uid (a reused directory) is not ours and starts over.
        """
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            state = Progress(**raw)
        except (OSError, ValueError, TypeError):
            state = None
        if state is not None and state.pod_uid == pod_uid and state.version == STATE_VERSION:
            return cls(path, state), True
        store = cls(path, Progress(pod_uid=pod_uid, anchor_us=start_us, covered_until_us=start_us))
        store.save()
        return store, False

    def save(self) -> None:
        atomic_write(self.path, json.dumps(asdict(self.state), sort_keys=True).encode())

    def allocate_seq(self) -> int:
        """A sequence number never used before by this pod, persisted before it is handed out."""
        with self._lock:
            seq = self.state.next_seq
            self.state.next_seq += 1
            self.save()
            return seq

    def advance(self, covered_until_us: int) -> None:
        """Record that reports now cover the pod's time up to `covered_until_us`."""
        with self._lock:
            self.state.covered_until_us = max(self.state.covered_until_us, covered_until_us)
            self.save()

    def catch_up(self, max_seq: int, max_end_us: int) -> None:
        """After a crash between writing a report and saving the state, trust the buffered report."""
        with self._lock:
            self.state.next_seq = max(self.state.next_seq, max_seq + 1)
            self.state.covered_until_us = max(self.state.covered_until_us, max_end_us)
            self.save()

    def record_drop(self, seconds: float) -> tuple[int, float]:
        """Count a report given up on; answers the running totals."""
        with self._lock:
            self.state.dropped_reports += 1
            self.state.dropped_seconds += seconds
            self.save()
            return self.state.dropped_reports, self.state.dropped_seconds
