"""The real pynvml calls, exercised without a GPU: pynvml loads a fake libnvidia-ml.so.1 compiled from C
against NVIDIA's nvml.h and driven by a scenario file: several GPUs, MIG, NotSupported, a GPU lost mid-run,
a driver that will not load, the library missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.discovery import Discovery
from sidecar.gpus import GpuSample, Selector
from sidecar.logs import EventLog
from sidecar.monitor import GpuMonitor
from sidecar.nvml import PynvmlBackend
from tests.sidecar.receiver import ReportReceiver
from tests.support.fakenvml.build import build, find_compiler, find_nvml_header
from tests.support.processes import REPO_ROOT, SidecarProcess, wait_until

GPU_A = "GPU-11111111-2222-3333-4444-555555555555"
GPU_B = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
MIG_B0 = "MIG-00000000-1111-2222-3333-444444444444"
MIG_B1 = "MIG-00000000-1111-2222-3333-555555555555"
GIB = 1024**3


def scenario_text(lost_marker: Path | None = None, lost_after: int | None = None, extra: str = "") -> str:
    lost = f" lost_marker={lost_marker}" if lost_marker else ""
    lost += f" lost_after={lost_after}" if lost_after is not None else ""
    return (
        "driver 560.35.03\n"
        f"gpu {GPU_A} util=10,50,90 mem_total={80 * GIB} mem_used={20 * GIB} energy_mj=5000 "
        f"energy_step_mj=2000 procs=4242:{GIB},4243:{2 * GIB}{lost}\n"
        f"gpu {GPU_B} util=30 mem_total={40 * GIB} mem_used={GIB}\n"
        f"mig {GPU_B} {MIG_B0} mem_total={10 * GIB} mem_used={GIB} unsupported=utilization,energy\n"
        f"mig {GPU_B} {MIG_B1} mem_total={10 * GIB} mem_used={2 * GIB} unsupported=utilization,energy\n"
        f"{extra}"
    )


@pytest.fixture
def scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The scenario file the fake library reads at nvmlInit, and a trace of the entry points called."""
    path = tmp_path / "scenario.txt"
    path.write_text(scenario_text())
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(path))
    monkeypatch.setenv("FAKE_NVML_TRACE", str(tmp_path / "trace.txt"))
    return path


def traced(scenario: Path) -> list[str]:
    trace = scenario.with_name("trace.txt")
    return trace.read_text().split() if trace.exists() else []


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def monitor_for(
    library: Path, selectors: tuple[Selector, ...], log: EventLog, clock: FakeClock
) -> GpuMonitor:
    return GpuMonitor(
        PynvmlBackend(library), lambda: Discovery("test", selectors), log, retry_max_seconds=8.0, clock=clock
    )


def by_uuid(samples: list[GpuSample]) -> dict[str, GpuSample]:
    return {sample.uuid: sample for sample in samples}


def test_all_devices_through_pynvml_gpus_and_mig_devices(fake_nvml_library: Path, scenario: Path) -> None:
    backend = PynvmlBackend(fake_nvml_library)
    assert backend.open() == "NVML driver 560.35.03"

    devices = backend.resolve([Selector("all")]).devices
    samples = by_uuid([backend.sample(device) for device in devices])
    backend.close()

    # GPU B has MIG on, so it is measured through its MIG devices.
    assert list(samples) == [GPU_A, MIG_B0, MIG_B1]
    assert samples[GPU_A] == GpuSample(
        uuid=GPU_A,
        name="NVIDIA Fake GPU",
        sm_util_pct=10.0,
        mem_used_bytes=20 * GIB,
        mem_total_bytes=80 * GIB,
        energy_millijoules=5000,
        process_count=2,
        process_mem_bytes=3 * GIB,
    )
    assert samples[MIG_B1] == GpuSample(
        uuid=MIG_B1,
        status="partial",
        name="NVIDIA Fake MIG 1g.10gb",
        parent_uuid=GPU_B,
        mem_used_bytes=2 * GIB,
        mem_total_bytes=10 * GIB,
        process_count=0,
        process_mem_bytes=0,
    )
    assert {d.uuid: d.unsupported for d in devices}[MIG_B0] == {"utilization", "energy"}
    calls = set(traced(scenario))
    assert {
        "nvmlInitWithFlags",
        "nvmlSystemGetDriverVersion",
        "nvmlDeviceGetCount_v2",
        "nvmlDeviceGetHandleByIndex_v2",
        "nvmlDeviceGetMigMode",
        "nvmlDeviceGetMaxMigDeviceCount",
        "nvmlDeviceGetMigDeviceHandleByIndex",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlShutdown",
    } <= calls


def test_selectors_by_uuid_mig_uuid_and_index(fake_nvml_library: Path, scenario: Path) -> None:
    backend = PynvmlBackend(fake_nvml_library)
    backend.open()

    chosen = backend.resolve(
        [
            Selector("uuid", MIG_B1),
            Selector("index", "0"),
            Selector("index", "1:0"),
            Selector("uuid", "GPU-gone"),
            Selector("index", "7"),
        ]
    )
    backend.close()

    assert [device.uuid for device in chosen.devices] == [MIG_B1, GPU_A, MIG_B0]
    assert not chosen.incomplete and chosen.missing_uuids == ()  # names nothing is not "lost"
    assert "nvmlDeviceGetHandleByUUID" in traced(scenario)


def test_a_not_supported_figure_is_asked_once_and_logged_once(
    fake_nvml_library: Path, scenario: Path, event_log: EventLog, caplog: pytest.LogCaptureFixture
) -> None:
    monitor = monitor_for(fake_nvml_library, (Selector("uuid", MIG_B0),), event_log, FakeClock())

    for _ in range(3):
        (sample,) = monitor.poll()
        assert sample.sm_util_pct is None and sample.mem_used_bytes == GIB
    monitor.close()

    assert traced(scenario).count("nvmlDeviceGetUtilizationRates") == 1
    assert [r.getMessage() for r in caplog.records].count("gpu_figures_not_supported") == 1


def test_a_gpu_lost_mid_run_degrades_only_that_gpu_then_reinitialises(
    fake_nvml_library: Path, scenario: Path, event_log: EventLog, caplog: pytest.LogCaptureFixture
) -> None:
    marker = scenario.with_name("gpu-a-lost")
    scenario.write_text(scenario_text(lost_marker=marker))
    clock = FakeClock()
    monitor = monitor_for(
        fake_nvml_library, (Selector("index", "0"), Selector("uuid", GPU_B)), event_log, clock
    )
    assert by_uuid(monitor.poll())[GPU_A].sm_util_pct == 10.0

    marker.touch()
    lost_polls = [by_uuid(monitor.poll()) for _ in range(3)]
    clock.now += 1.5  # past the first retry: re-initialised, still lost
    lost_polls.append(by_uuid(monitor.poll()))
    marker.unlink()
    clock.now += 10  # past the (doubled) retry
    recovered = by_uuid(monitor.poll())
    monitor.close()

    for polled in lost_polls:
        assert polled[GPU_A].status == "lost" and polled[GPU_A].mem_used_bytes is None
        assert polled[MIG_B0].mem_used_bytes == GIB and polled[MIG_B1].mem_used_bytes == 2 * GIB
    assert recovered[GPU_A].mem_used_bytes == 20 * GIB
    assert traced(scenario).count("nvmlInitWithFlags") == 3
    messages = [r.getMessage() for r in caplog.records]
    assert messages.count("gpu_lost") == 1
    assert messages.count("gpu_figures_not_supported") == 2  # one line per MIG device, not per init
    assert messages[-1] == "gpu_recovered"


def test_lost_after_n_reads_recovers_at_the_next_init(
    fake_nvml_library: Path, scenario: Path, event_log: EventLog
) -> None:
    scenario.write_text(scenario_text(lost_after=2))
    clock = FakeClock()
    monitor = monitor_for(fake_nvml_library, (Selector("uuid", GPU_A),), event_log, clock)

    figures = [monitor.poll()[0].mem_used_bytes for _ in range(4)]
    clock.now += 1.5
    figures.append(monitor.poll()[0].mem_used_bytes)
    monitor.close()

    # The second memory read is the last: the same sample's energy call already meets a lost GPU, so the
    # whole second sample counts as lost; the re-initialisation after the 1 s backoff brings it back.
    assert figures == [20 * GIB, None, None, None, 20 * GIB]


def test_a_gpu_lost_at_lookup_does_not_take_down_the_all_selector_and_is_added_when_it_answers(
    fake_nvml_library: Path, scenario: Path, event_log: EventLog
) -> None:
    marker = scenario.with_name("gpu-a-lost")
    marker.touch()
    scenario.write_text(scenario_text(lost_marker=marker))
    clock = FakeClock()
    monitor = monitor_for(fake_nvml_library, (Selector("all"),), event_log, clock)

    while_lost = by_uuid(monitor.poll())
    marker.unlink()
    clock.now += 1.5  # past the first retry
    answered = by_uuid(monitor.poll())
    monitor.close()

    assert set(while_lost) == {MIG_B0, MIG_B1}
    assert set(answered) == {GPU_A, MIG_B0, MIG_B1}
    assert answered[GPU_A].status == "ok" and answered[GPU_A].mem_used_bytes == 20 * GIB


def test_a_lost_gpu_named_by_uuid_is_reported_lost_and_re_added_when_it_answers(
    fake_nvml_library: Path, scenario: Path, event_log: EventLog, caplog: pytest.LogCaptureFixture
) -> None:
    marker = scenario.with_name("gpu-a-lost")
    scenario.write_text(scenario_text(lost_marker=marker))
    clock = FakeClock()
    monitor = monitor_for(fake_nvml_library, (Selector("uuid", GPU_A),), event_log, clock)
    monitor.poll()

    marker.touch()
    polls = [monitor.poll()]
    for _ in range(3):  # re-initialised at every backoff step; the handle lookup itself fails now
        clock.now += 10
        polls.append(monitor.poll())
    marker.unlink()
    clock.now += 10
    (back,) = monitor.poll()
    monitor.close()

    assert all(
        [(g.uuid, g.status, g.mem_used_bytes) for g in polled] == [(GPU_A, "lost", None)] for polled in polls
    )
    assert back.status == "ok" and back.mem_used_bytes == 20 * GIB
    assert [r.getMessage() for r in caplog.records][-1] == "gpu_recovered"


def test_process_lists_fall_back_to_v2_on_drivers_without_v3(
    tmp_path: Path, scenario: Path, event_log: EventLog
) -> None:
    compiler, header = find_compiler(), find_nvml_header()
    if compiler is None or header is None:
        pytest.skip("no C compiler or nvml.h")
    old_driver = build(tmp_path / "old", compiler, header, old_driver=True)
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from sidecar.nvml import PynvmlBackend\n"
        "from sidecar.gpus import Selector\n"
        "backend = PynvmlBackend(Path(sys.argv[1]))\n"
        "backend.open()\n"
        "(device,) = backend.resolve([Selector('index', '0')]).devices\n"
        "for _ in range(2):\n"
        "    sample = backend.sample(device)\n"
        "    print(sample.process_count, sample.process_mem_bytes, sample.status)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", code, str(old_driver)], env=env, capture_output=True, text=True, check=True
    )

    assert result.stdout.splitlines() == [f"2 {3 * GIB} ok", f"2 {3 * GIB} ok"]
    calls = traced(scenario)
    assert "nvmlDeviceGetComputeRunningProcesses_v3" not in calls
    assert calls.count("nvmlDeviceGetComputeRunningProcesses_v2") == 4  # per sample: size, then the list


def test_a_driver_that_will_not_load_is_retried_with_backoff(
    fake_nvml_library: Path, scenario: Path, event_log: EventLog, caplog: pytest.LogCaptureFixture
) -> None:
    scenario.write_text(scenario_text(extra="init_error 9\n"))
    clock = FakeClock()
    monitor = monitor_for(fake_nvml_library, (Selector("uuid", GPU_A),), event_log, clock)

    while_down = []
    for _ in range(5):
        while_down.append(monitor.poll())
        clock.now += 0.5
    inits_while_down = traced(scenario).count("nvmlInitWithFlags")
    scenario.write_text(scenario_text())
    clock.now += 10
    (after,) = monitor.poll()
    monitor.close()

    assert all(polled == [GpuSample(uuid=GPU_A, status="unavailable")] for polled in while_down)
    assert inits_while_down == 2  # at 0 s and after the 1 s backoff; the next try waits 2 s
    assert after.sm_util_pct is not None
    messages = [r.getMessage() for r in caplog.records]
    assert messages.count("nvml_unavailable") == 1
    assert "Driver Not Loaded" in next(
        r.reason for r in caplog.records if r.getMessage() == "nvml_unavailable"
    )  # type: ignore[attr-defined]


def test_library_missing_is_backend_unavailable(tmp_path: Path) -> None:
    """In a fresh interpreter: pynvml keeps a loaded library for the life of the process."""
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from sidecar.nvml import PynvmlBackend\n"
        "from sidecar.gpus import BackendUnavailable\n"
        "for library in (Path(sys.argv[1]), None):\n"
        "    try:\n"
        "        PynvmlBackend(library).open()\n"
        "        print('opened')\n"
        "    except BackendUnavailable as error:\n"
        "        print('unavailable:', error)\n"
    )
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO_ROOT), "LD_LIBRARY_PATH": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "libnvidia-ml.so.1")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO_ROOT,
    )

    by_path, by_name = result.stdout.splitlines()
    assert by_path.startswith("unavailable: cannot load")
    if by_name == "opened":
        pytest.skip("this machine has a real libnvidia-ml.so.1; the missing-library case cannot be shown")
    assert by_name == "unavailable: NVML initialisation failed: NVML Shared Library Not Found"


def test_the_sidecar_loads_the_fake_through_ld_library_path_and_reports_its_figures(
    fake_nvml_library: Path,
    scenario: Path,
    tmp_path: Path,
    receiver: ReportReceiver,
    sidecar_env: dict[str, str],
) -> None:
    env = {
        **sidecar_env,
        "SIDECAR_NVML_BACKEND": "pynvml",
        "LD_LIBRARY_PATH": str(fake_nvml_library.parent),
        "FAKE_NVML_SCENARIO": str(scenario),
        "NVIDIA_VISIBLE_DEVICES": f"{GPU_A},{MIG_B0}",
    }
    sidecar = SidecarProcess(env, tmp_path / "sidecar.log")
    wait_until(lambda: len(receiver.accepted()) >= 2, what="two reports")

    assert sidecar.terminate() == 0
    reports = receiver.accepted()
    figures = {gpu["uuid"]: gpu for gpu in reports[1]["gpus"]}
    assert set(figures) == {GPU_A, MIG_B0}
    assert figures[GPU_A]["sm_util_max_pct"] in (10.0, 50.0, 90.0)
    assert figures[GPU_A]["mem_total_bytes"] == 80 * GIB
    assert figures[MIG_B0]["sm_util_pct"] is None and figures[MIG_B0]["mem_used_bytes"] == GIB
    discovered = next(e for e in sidecar.events() if e["event"] == "gpus_discovered")
    assert discovered["backend"] == "NVML driver 560.35.03"
    assert discovered["strategy"] == "nvidia_visible_devices"


def test_without_the_library_the_sidecar_still_reports_allocation(
    tmp_path: Path, receiver: ReportReceiver, sidecar_env: dict[str, str]
) -> None:
    env = {
        **sidecar_env,
        "SIDECAR_NVML_BACKEND": "pynvml",
        "SIDECAR_NVML_LIBRARY": str(tmp_path / "absent" / "libnvidia-ml.so.1"),
        "NVIDIA_VISIBLE_DEVICES": GPU_A,
    }
    sidecar = SidecarProcess(env, tmp_path / "sidecar.log")
    wait_until(lambda: len(receiver.accepted()) >= 2, what="two reports")

    assert sidecar.terminate() == 0
    assert receiver.accepted()[0]["gpus"] == [
        {
            "uuid": GPU_A,
            "sm_util_pct": None,
            "mem_used_bytes": None,
            "mem_total_bytes": None,
            "sm_util_max_pct": None,
            "energy_joules": None,
            "status": "unavailable",
        }
    ]
    assert sidecar.event_names().count("nvml_unavailable") == 1
    assert json.dumps(sidecar.events()).count("cannot load") >= 1
