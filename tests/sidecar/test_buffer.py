"""The on-disk buffer: bounded by count, bytes and age; the oldest contiguous reports folded into one
with a fresh sequence number; a drop only when nothing can fold, and every drop counted."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from gpuaccounting.clock import to_datetime
from gpuaccounting.wire import format_timestamp
from sidecar.buffer import ReportBuffer
from sidecar.logs import EventLog
from sidecar.progress import ProgressStore
from tests.sidecar.factories import pod_report

T0 = 1_790_000_000_000_000  # microseconds since the epoch
STEP = 30_000_000
GPU = "GPU-11111111-2222-3333-4444-555555555555"


def figures(util: float) -> list:
    return [
        {
            "uuid": GPU,
            "sm_util_pct": util,
            "sm_util_max_pct": util,
            "mem_used_bytes": 1,
            "mem_total_bytes": 2,
            "energy_joules": 1.0,
        }
    ]


class Harness:
    def __init__(self, directory: Path, log: EventLog, **bounds: int) -> None:
        self.store, _ = ProgressStore.open(directory / "state.json", "pod-uid", T0)
        self.dir = directory / "pending"
        self.log = log
        self.bounds = {
            "max_reports": 100,
            "max_bytes": 1 << 20,
            "max_age_us": 10**12,
            "max_interval_us": 10**12,
            **bounds,
        }
        self.buffer = self.fresh_buffer()

    def fresh_buffer(self) -> ReportBuffer:
        buffer = ReportBuffer(
            self.dir,
            allocate_seq=self.store.allocate_seq,
            record_drop=self.store.record_drop,
            log=self.log,
            **self.bounds,
        )
        buffer.load()
        return buffer

    def cut(self, start: int, end: int, util: float = 50.0, now: int | None = None) -> int:
        seq = self.store.allocate_seq()
        pending = self.buffer.store(pod_report(seq, start, end, figures(util)))
        self.store.advance(end)
        self.buffer.admit(pending, now if now is not None else end)
        return seq

    def bodies(self) -> list[dict]:
        return [self.buffer.read(p) for p in self.buffer.load()]  # type: ignore[misc]


@pytest.fixture
def harness(tmp_path: Path, event_log: EventLog) -> Harness:
    return Harness(tmp_path, event_log, max_reports=3)


def test_reports_leave_in_interval_order_and_go_when_removed(harness: Harness) -> None:
    first = harness.cut(T0, T0 + STEP)
    harness.cut(T0 + STEP, T0 + 2 * STEP)

    oldest = harness.buffer.oldest()
    assert oldest is not None and oldest.seq == first
    harness.buffer.remove(oldest)

    assert len(harness.buffer) == 1
    assert not oldest.path.exists()


def test_over_the_count_the_oldest_two_fold_into_one_with_a_fresh_seq(harness: Harness) -> None:
    for k in range(4):
        harness.cut(T0 + k * STEP, T0 + (k + 1) * STEP, util=10.0 * (k + 1))

    bodies = harness.bodies()

    assert len(bodies) == 3
    folded = bodies[0]
    assert folded["seq"] == 5  # seqs 1-4 were the cuts; the fold took the next unused number
    assert (folded["interval_start"], folded["interval_end"]) == (
        format_timestamp(to_datetime(T0)),
        format_timestamp(to_datetime(T0 + 2 * STEP)),
    )
    assert folded["gpus"][0]["sm_util_pct"] == 15.0
    assert [b["seq"] for b in bodies[1:]] == [3, 4]
    assert harness.store.state.dropped_reports == 0


def test_buffered_time_is_conserved_by_folding(harness: Harness) -> None:
    for k in range(10):
        harness.cut(T0 + k * STEP, T0 + (k + 1) * STEP)

    pending = harness.buffer.load()

    assert len(pending) == 3
    assert sum(p.end_us - p.start_us for p in pending) == 10 * STEP
    assert all(a.end_us == b.start_us for a, b in itertools.pairwise(pending))


def test_without_contiguous_neighbours_the_oldest_is_dropped_and_counted(harness: Harness) -> None:
    # Gaps between every report (as after an earlier drop): nothing can fold.
    for k in range(4):
        harness.cut(T0 + 2 * k * STEP, T0 + (2 * k + 1) * STEP)

    pending = harness.buffer.load()

    assert [p.start_us for p in pending] == [T0 + 2 * STEP, T0 + 4 * STEP, T0 + 6 * STEP]
    assert harness.store.state.dropped_reports == 1
    assert harness.store.state.dropped_seconds == STEP / 1e6


def test_reports_older_than_the_age_bound_fold_into_one(tmp_path: Path, event_log: EventLog) -> None:
    harness = Harness(tmp_path, event_log, max_age_us=5 * STEP, max_interval_us=100 * STEP)
    for k in range(8):
        harness.cut(T0 + k * STEP, T0 + (k + 1) * STEP, now=T0 + 10 * STEP)

    pending = harness.buffer.load()

    # Reports ending before now - 5 steps (the first four) became one; the rest are untouched.
    assert [(p.start_us - T0) // STEP for p in pending] == [0, 4, 5, 6, 7]
    assert pending[0].end_us == T0 + 4 * STEP


def test_no_fold_makes_an_interval_longer_than_the_timekeeper_accepts(
    tmp_path: Path, event_log: EventLog
) -> None:
    harness = Harness(tmp_path, event_log, max_reports=3, max_interval_us=2 * STEP)
    for k in range(4):
        harness.cut(T0 + k * STEP, T0 + (k + 1) * STEP)
    lengths_after_fold = [(p.end_us - p.start_us) // STEP for p in harness.buffer.load()]
    harness.cut(T0 + 4 * STEP, T0 + 5 * STEP)  # [2, 1, 1, 1]: the two single ones fold: [2, 2, 1]
    harness.cut(T0 + 5 * STEP, T0 + 6 * STEP)  # [2, 2, 1, 1]: again: [2, 2, 2]
    harness.cut(T0 + 6 * STEP, T0 + 7 * STEP)  # [2, 2, 2, 1]: nothing can fold, the oldest goes

    pending = harness.buffer.load()

    assert lengths_after_fold == [2, 1, 1]
    assert all(p.end_us - p.start_us <= 2 * STEP for p in pending)
    assert harness.store.state.dropped_reports == 1
    assert pending[0].start_us == T0 + 2 * STEP


def test_a_fold_interrupted_before_deleting_its_parts_is_resolved_on_load(harness: Harness) -> None:
    harness.cut(T0, T0 + STEP)
    harness.cut(T0 + STEP, T0 + 2 * STEP)
    parts = [p.path.read_bytes() for p in harness.buffer.load()]
    harness.cut(T0 + 2 * STEP, T0 + 3 * STEP)
    harness.cut(T0 + 3 * STEP, T0 + 4 * STEP)  # folds seqs 1 and 2 into seq 5
    for seq, data in zip((1, 2), parts, strict=True):  # as if the crash came before the unlinks
        (harness.dir / f"report-{seq:012d}.json").write_bytes(data)

    reloaded = harness.fresh_buffer().load()

    assert [p.seq for p in reloaded] == [5, 3, 4]
    assert not (harness.dir / "report-000000000001.json").exists()


def test_state_catches_up_with_a_report_written_just_before_a_crash(harness: Harness) -> None:
    seq = harness.store.allocate_seq()
    harness.buffer.store(pod_report(seq, T0, T0 + STEP))  # crash here: the state never heard of the cut
    reopened, resumed = ProgressStore.open(harness.store.path, "pod-uid", T0 + 99 * STEP)
    left = harness.fresh_buffer().load()

    reopened.catch_up(max(p.seq for p in left), max(p.end_us for p in left))

    assert resumed
    assert reopened.state.covered_until_us == T0 + STEP
    assert reopened.state.next_seq == seq + 1
    assert reopened.state.anchor_us == T0


def test_a_report_write_cut_short_by_a_kill_leaves_no_file_behind(harness: Harness) -> None:
    harness.cut(T0, T0 + STEP)
    seq = harness.store.allocate_seq()  # persisted before the write, as in a cut
    partial = harness.dir / f".report-{seq:012d}.json.tmp"
    partial.write_bytes(b'{"seq": ')  # the kill came before atomic_write's rename

    reloaded = harness.fresh_buffer().load()

    assert [p.seq for p in reloaded] == [1]
    assert sorted(path.name for path in harness.dir.iterdir()) == ["report-000000000001.json"]
