"""Delivery: acknowledged on 2xx (duplicates too), retried with backoff on 401/403/408/429/5xx and network
errors, a refused body resent without figures before anything is dropped, the token re-read every send."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuaccounting.names import REPORTS_PATH
from sidecar.buffer import ReportBuffer
from sidecar.logs import EventLog
from sidecar.progress import ProgressStore
from sidecar.sender import Outcome, Sender, TimekeeperClient, classify
from tests.sidecar.factories import pod_report
from tests.sidecar.receiver import ReportReceiver
from tests.support.processes import REPO_ROOT, free_port

T0 = 1_790_000_000_000_000
STEP = 1_000_000
GPU = "GPU-11111111-2222-3333-4444-555555555555"


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (200, Outcome.ACKNOWLEDGED),
        (201, Outcome.ACKNOWLEDGED),
        (401, Outcome.RETRY),
        (403, Outcome.RETRY),
        (408, Outcome.RETRY),
        (429, Outcome.RETRY),
        (500, Outcome.RETRY),
        (503, Outcome.RETRY),
        (400, Outcome.REJECTED),
        (404, Outcome.REJECTED),
        (409, Outcome.REJECTED),
        (422, Outcome.REJECTED),
    ],
)
def test_status_classification(status: int, outcome: Outcome) -> None:
    assert classify(status) is outcome


class Rig:
    """A buffer with `count` contiguous reports, a sender pointed at `url`."""

    def __init__(
        self,
        tmp_path: Path,
        url: str,
        token_file: Path,
        log: EventLog,
        count: int,
        max_reports: int = 100,
        figures: bool = True,
        cluster: str | None = None,
    ) -> None:
        self.store, _ = ProgressStore.open(tmp_path / "state.json", "pod-uid", T0)
        self.buffer = ReportBuffer(
            tmp_path / "pending",
            max_reports=max_reports,
            max_bytes=1 << 20,
            max_age_us=10**12,
            max_interval_us=10**12,
            allocate_seq=self.store.allocate_seq,
            record_drop=self.store.record_drop,
            log=log,
        )
        for k in range(count):
            gpus = (
                [{"uuid": GPU, "sm_util_pct": 1.0, "mem_used_bytes": 1, "mem_total_bytes": 2}]
                if figures
                else []
            )
            report = pod_report(self.store.allocate_seq(), T0 + k * STEP, T0 + (k + 1) * STEP, gpus)
            self.buffer.admit(self.buffer.store(report), T0)
        self.sender = Sender(
            self.buffer,
            TimekeeperClient(url, token_file, timeout=2.0, cluster=cluster),
            retry_base=0.01,
            retry_max=0.05,
            record_drop=self.store.record_drop,
            log=log,
        )

    def deliver_all(self) -> bool:
        self.sender.start()
        self.sender.wake()
        return self.sender.drain(timeout=10.0)


def test_reports_go_oldest_first_with_the_bearer_token(
    tmp_path: Path, receiver: ReportReceiver, token_file: Path, event_log: EventLog
) -> None:
    rig = Rig(tmp_path, receiver.url, token_file, event_log, count=3)

    assert rig.deliver_all()

    assert [r.body["seq"] for r in receiver.requests] == [1, 2, 3]
    assert {r.path for r in receiver.requests} == {REPORTS_PATH}
    assert {r.authorization for r in receiver.requests} == {f"Bearer {token_file.read_text()}"}
    assert list((tmp_path / "pending").iterdir()) == []


def test_a_members_sidecar_names_its_cluster_on_every_report(
    tmp_path: Path, receiver: ReportReceiver, token_file: Path, event_log: EventLog
) -> None:
    """In a fleet the hub reviews the token with the named member's API server (docs/fleet.md)."""
    rig = Rig(tmp_path, receiver.url, token_file, event_log, count=2, cluster="eu-b")

    assert rig.deliver_all()

    assert [r.cluster for r in receiver.requests] == ["eu-b", "eu-b"]


def test_a_single_clusters_sidecar_names_no_cluster(
    tmp_path: Path, receiver: ReportReceiver, token_file: Path, event_log: EventLog
) -> None:
    rig = Rig(tmp_path, receiver.url, token_file, event_log, count=1)

    assert rig.deliver_all()

    assert [r.cluster for r in receiver.requests] == [None]


def test_transient_failures_are_retried_until_acknowledged(
    tmp_path: Path, receiver: ReportReceiver, token_file: Path, event_log: EventLog
) -> None:
    receiver.script.extend([503, 401, 429, 500, 403, 408])
    rig = Rig(tmp_path, receiver.url, token_file, event_log, count=2)

    assert rig.deliver_all()

    assert [r.status for r in receiver.requests] == [503, 401, 429, 500, 403, 408, 200, 200]
    assert [b["seq"] for b in receiver.accepted()] == [1, 2]
    assert rig.store.state.dropped_reports == 0


def test_a_duplicate_answer_counts_as_acknowledged(
    tmp_path: Path, receiver: ReportReceiver, token_file: Path, event_log: EventLog
) -> None:
    receiver.seen.add(("pod-uid", 1))
    rig = Rig(tmp_path, receiver.url, token_file, event_log, count=1)

    assert rig.deliver_all()

    assert len(receiver.requests) == 1
    assert receiver.requests[0].body["_duplicate"] is True


def test_a_refused_body_is_resent_without_figures(
    tmp_path: Path, receiver: ReportReceiver, token_file: Path, event_log: EventLog
) -> None:
    receiver.script.append(422)
    rig = Rig(tmp_path, receiver.url, token_file, event_log, count=1)

    assert rig.deliver_all()

    first, second = receiver.requests
    assert first.body["gpus"] and first.status == 422
    assert second.body["gpus"] == [] and second.status == 200
    assert second.body["seq"] == first.body["seq"]
    assert second.body["interval_start"] == first.body["interval_start"]
    assert rig.store.state.dropped_reports == 0


def test_a_report_refused_twice_is_dropped_and_counted(
    tmp_path: Path, receiver: ReportReceiver, token_file: Path, event_log: EventLog
) -> None:
    receiver.script.extend([400, 400])
    rig = Rig(tmp_path, receiver.url, token_file, event_log, count=2)

    assert rig.deliver_all()

    assert [r.status for r in receiver.requests] == [400, 400, 200]
    assert rig.store.state.dropped_reports == 1
    assert rig.store.state.dropped_seconds == 1.0


def test_the_token_file_is_read_for_every_send(
    tmp_path: Path, receiver: ReportReceiver, token_file: Path, event_log: EventLog
) -> None:
    client = TimekeeperClient(receiver.url, token_file, timeout=2.0)
    report = pod_report(1, T0, T0 + STEP)

    client.send(report)
    token_file.write_text("rotated-token\n")
    client.send(report)

    assert receiver.requests[1].authorization == "Bearer rotated-token"
    assert receiver.requests[0].authorization != receiver.requests[1].authorization


def test_a_missing_token_or_closed_port_means_retry(tmp_path: Path, receiver: ReportReceiver) -> None:
    report = pod_report(1, T0, T0 + STEP)
    closed_port = free_port()
    token = tmp_path / "token"
    token.write_text("t")

    no_token = TimekeeperClient(receiver.url, tmp_path / "absent", timeout=2.0).send(report)
    no_server = TimekeeperClient(f"http://127.0.0.1:{closed_port}", token, timeout=2.0).send(report)

    assert no_token.outcome is Outcome.RETRY and "token" in no_token.detail
    assert no_server.outcome is Outcome.RETRY
    assert receiver.requests == []


@pytest.mark.parametrize(("url", "loads_openssl"), [("http://timekeeper:8080", False), ("https://tk", True)])
def test_openssl_is_loaded_only_for_an_https_timekeeper(
    url: str, loads_openssl: bool, tmp_path: Path
) -> None:
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from sidecar.sender import TimekeeperClient\n"
        "client = TimekeeperClient(sys.argv[1], Path('token'), 1.0)\n"
        "print('ssl' in sys.modules, type(client._connection()).__name__)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, url],
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO_ROOT)},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )

    expected = "HTTPSConnection" if loads_openssl else "HTTPConnection"
    assert result.stdout.split() == [str(loads_openssl), expected]


class FoldingClient(TimekeeperClient):
    """Sends as usual, but first cuts one more report into a full buffer, so a fold absorbs the report
    on its way: the race between the sampling loop and the sender, made deterministic."""

    def __init__(self, rig: Rig, url: str, token_file: Path) -> None:
        super().__init__(url, token_file, timeout=2.0)
        self.rig = rig
        self.raced = False

    def send(self, report):  # type: ignore[no-untyped-def]
        if not self.raced:
            self.raced = True
            k = 2
            late = pod_report(self.rig.store.allocate_seq(), T0 + k * STEP, T0 + (k + 1) * STEP)
            self.rig.buffer.admit(self.rig.buffer.store(late), T0)
        return super().send(report)


def test_a_report_folded_while_it_was_sent_is_not_counted_as_dropped(
    tmp_path: Path,
    receiver: ReportReceiver,
    token_file: Path,
    event_log: EventLog,
    caplog: pytest.LogCaptureFixture,
) -> None:
    receiver.script.append(400)  # the first report is refused; by then a fold holds its time anyway
    rig = Rig(tmp_path, receiver.url, token_file, event_log, count=2, max_reports=2, figures=False)
    rig.sender = Sender(
        rig.buffer,
        FoldingClient(rig, receiver.url, token_file),
        retry_base=0.01,
        retry_max=0.05,
        record_drop=rig.store.record_drop,
        log=event_log,
    )

    assert rig.deliver_all()

    assert rig.store.state.dropped_reports == 0
    assert "report_dropped" not in [r.getMessage() for r in caplog.records]
    stamps = [pod_report(0, T0 + k * STEP, T0 + (k + 1) * STEP) for k in range(3)]
    # The refused report's second went out inside the fold of the first two; nothing was lost.
    assert [(b["interval_start"], b["interval_end"]) for b in receiver.accepted()] == [
        (stamps[0]["interval_start"], stamps[1]["interval_end"]),
        (stamps[2]["interval_start"], stamps[2]["interval_end"]),
    ]
