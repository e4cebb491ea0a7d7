"""The sidecar's main loop: sample every second, cut a report at every boundary of the pod's fixed interval
grid, and on SIGTERM send the partial interval as `final: true`. A restart resumes from the persisted end
with fresh sequence numbers, so the time it was down is reported too (docs/sidecar.md)."""

from __future__ import annotations

import threading
import time

from gpuaccounting.clock import WallClock, to_datetime
from gpuaccounting.wire import GpuMeasurements, build_report
from sidecar.aggregate import IntervalAggregate
from sidecar.buffer import ReportBuffer
from sidecar.config import Config
from sidecar.discovery import Discovery, discover
from sidecar.fakegpu import FakeBackend
from sidecar.gpus import GpuBackend, Selector
from sidecar.logs import EventLog
from sidecar.monitor import GpuMonitor
from sidecar.nvml import PynvmlBackend
from sidecar.progress import ProgressStore
from sidecar.sender import Sender, TimekeeperClient

STATE_FILE = "state.json"
PENDING_DIR = "pending"


def grid_floor(anchor_us: int, interval_us: int, moment_us: int) -> int:
    """The latest interval boundary at or before `moment_us`."""
    return anchor_us + ((moment_us - anchor_us) // interval_us) * interval_us


def make_backend(config: Config) -> GpuBackend:
    """fake; nodeagent; pynvml, asking the node agent first when SIDECAR_NODEAGENT_URL names one."""
    if config.nvml_backend == "fake":
        return FakeBackend(seed=config.pod_uid, count=config.fake_gpu_count)
    if config.nodeagent_url is None:
        return PynvmlBackend(config.nvml_library)
    from sidecar.nodeagent import AgentFirstBackend, NodeAgentBackend

    agent = NodeAgentBackend(
        config.nodeagent_url,
        config.nodeagent_token_file,
        timeout=config.request_timeout_seconds,
        # One request serves every device of a sample tick.
        max_age_seconds=config.sample_interval_seconds / 2,
    )
    if config.nvml_backend == "nodeagent":
        return agent
    return AgentFirstBackend(agent, PynvmlBackend(config.nvml_library))


def make_discovery(config: Config) -> Discovery:
    """Discovery by the ordered strategies; the fake backend's GPUs stand in when none answers. The node
    agent knows the pod's devices itself."""
    if config.nvml_backend == "nodeagent":
        return Discovery("nodeagent", ())
    found = discover(config.visible_devices, config.podinfo_dir)
    if found.selectors or config.nvml_backend != "fake":
        return found
    return Discovery("fake_all", (Selector("all"),))


class Sidecar:
    """One run of the sidecar; `run()` returns when `stop` is set and the final report is handled."""

    def __init__(
        self, config: Config, log: EventLog, stop: threading.Event, clock: WallClock | None = None
    ) -> None:
        self.config = config
        self.log = log
        self.stop = stop
        # Every time the sidecar stamps, anchors or ages comes from this clock; sampling, retries and
        # timeouts stay in real time.
        self.clock = clock or config.clock()
        config.buffer_dir.mkdir(parents=True, exist_ok=True)
        self.store, self.resumed = ProgressStore.open(
            config.buffer_dir / STATE_FILE, config.pod_uid, self.clock.now_us()
        )
        self.buffer = ReportBuffer(
            config.buffer_dir / PENDING_DIR,
            max_reports=config.buffer_max_reports,
            max_bytes=config.buffer_max_bytes,
            max_age_us=int(config.buffer_max_age_seconds * 1e6),
            max_interval_us=int(config.max_report_interval_seconds * 1e6),
            allocate_seq=self.store.allocate_seq,
            record_drop=self.store.record_drop,
            log=log,
        )
        self.monitor = GpuMonitor(
            make_backend(config), lambda: make_discovery(config), log, config.nvml_retry_max_seconds
        )
        self.aggregate = IntervalAggregate()
        self.sender = Sender(
            self.buffer,
            TimekeeperClient(
                config.timekeeper_url, config.token_file, config.request_timeout_seconds, config.cluster
            ),
            retry_base=config.retry_base_seconds,
            retry_max=config.retry_max_seconds,
            record_drop=self.store.record_drop,
            log=log,
        )
        self.interval_us = max(1, round(config.report_interval_seconds * 1e6))
        self.max_interval_us = max(self.interval_us, int(config.max_report_interval_seconds * 1e6))

    def _cut(self, end_us: int, *, final: bool) -> None:
        """Close the time [covered_until, end_us) in reports no longer than the timekeeper accepts (after a
        long downtime there are several); the samples belong to the last one, the time while down had none."""
        while end_us - self.store.state.covered_until_us > self.max_interval_us:
            self._cut_one(self.store.state.covered_until_us + self.max_interval_us, final=False, gpus=[])
        # Per-process measurements have no field in the v1 report; they go to the debug log with the cut.
        processes = self.aggregate.processes_max()
        self._cut_one(end_us, final=final, gpus=self.aggregate.cut(), processes=processes)

    def _cut_one(
        self,
        end_us: int,
        *,
        final: bool,
        gpus: list[GpuMeasurements],
        processes: dict[str, int | None] | None = None,
    ) -> None:
        """Number one interval from covered_until to `end_us`, store it, then let the sender see it."""
        start_us = self.store.state.covered_until_us
        seq = self.store.allocate_seq()
        report = build_report(
            namespace=self.config.namespace,
            pod=self.config.pod_name,
            pod_uid=self.config.pod_uid,
            seq=seq,
            interval_start=to_datetime(start_us),
            interval_end=to_datetime(end_us),
            gpu_share=self.config.gpu_share,
            gpus=gpus,
            final=final,
        )
        pending = self.buffer.store(report)
        self.store.advance(end_us)
        self.buffer.admit(pending, self.clock.now_us())
        self.sender.wake()
        self.log.debug(
            "interval_cut",
            seq=seq,
            seconds=(end_us - start_us) / 1e6,
            final=final,
            max_compute_processes=processes or {},
        )

    def _announce_start(self) -> None:
        leftovers = self.buffer.load()
        if leftovers:
            self.store.catch_up(max(p.seq for p in leftovers), max(p.end_us for p in leftovers))
        state = self.store.state
        self.log.info(
            "sidecar_started",
            resumed=self.resumed,
            next_seq=state.next_seq,
            pending_reports=len(leftovers),
            unreported_seconds=round(max(0, self.clock.now_us() - state.covered_until_us) / 1e6, 3),
            report_interval_seconds=self.config.report_interval_seconds,
            sample_interval_seconds=self.config.sample_interval_seconds,
            backend=self.config.nvml_backend,
            clock_speed=self.clock.speed,
            clock_now=self.clock.now().isoformat(),
        )

    def run(self) -> None:
        self._announce_start()
        self.sender.start()
        self.sender.wake()
        sample_every = self.config.sample_interval_seconds
        next_sample = time.monotonic()
        anchor = self.store.state.anchor_us
        while not self.stop.is_set():
            if time.monotonic() >= next_sample:
                self.aggregate.add(self.monitor.poll())
                next_sample = max(next_sample + sample_every, time.monotonic())
            due_end = grid_floor(anchor, self.interval_us, self.clock.now_us())
            if due_end > self.store.state.covered_until_us:
                self._cut(due_end, final=False)
            # The boundary is in the clock's time; the wait is real time.
            until_boundary = self.clock.real_seconds((due_end + self.interval_us - self.clock.now_us()) / 1e6)
            self.stop.wait(max(0.0, min(next_sample - time.monotonic(), until_boundary)))
        self._shutdown()

    def _shutdown(self) -> None:
        end = self.clock.now_us()
        if end > self.store.state.covered_until_us:
            self._cut(end, final=True)
        self.monitor.close()
        delivered = self.sender.drain(self.config.shutdown_timeout_seconds)
        state = self.store.state
        fields = {
            "covered_until": to_datetime(state.covered_until_us).isoformat(),
            "reports_acknowledged": self.sender.acknowledged,
            "pending_reports": len(self.buffer),
            "dropped_reports_total": state.dropped_reports,
        }
        if delivered:
            self.log.info("sidecar_stopped", **fields)
        else:
            self.log.error(
                "sidecar_stopped_with_undelivered_reports",
                undelivered_seconds=round(self.buffer.pending_seconds(), 3),
                **fields,
            )
