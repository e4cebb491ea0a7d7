"""The agent's NVML reader through pynvml and the fake libnvidia-ml: every device with its processes and
their SM utilisation, a MIG device without per-process utilisation, a lost GPU reported `lost` while the
others carry on, then read again once a re-initialisation finds it answering."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.gpus import NodeNvml

GIB = 1024**3
GPU_A = "GPU-aaaaaaaa-0000-4000-8000-000000000001"
GPU_B = "GPU-bbbbbbbb-0000-4000-8000-000000000002"
MIG_B = "MIG-bbbbbbbb-1111-4000-8000-000000000003"


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def test_devices_processes_and_a_lost_gpu(
    fake_nvml_library: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "lost"
    scenario = tmp_path / "scenario.txt"
    scenario.write_text(
        f"gpu {GPU_A} util=80 mem_total={80 * GIB} mem_used={5 * GIB} procs=11:{2 * GIB},12:{3 * GIB} "
        f"proc_util=11:50,12:30 lost_marker={marker}\n"
        f"gpu {GPU_B} mem_total={80 * GIB} mem_used={GIB}\n"
        f"mig {GPU_B} {MIG_B} mem_total={10 * GIB} mem_used={GIB} unsupported=utilization,energy "
        f"procs=21:{GIB}\n"
    )
    monkeypatch.setenv("FAKE_NVML_SCENARIO", str(scenario))
    clock = Clock()
    nvml = NodeNvml(fake_nvml_library, reinit_seconds=10, clock=clock)

    first = {r.uuid: r for r in nvml.read()}
    marker.touch()
    lost = {r.uuid: r for r in nvml.read()}
    clock.now += 11  # re-initialised: GPU A's lookup itself fails now, it stays listed as lost
    still = {r.uuid: r for r in nvml.read()}
    marker.unlink()
    clock.now += 11
    back = {r.uuid: r for r in nvml.read()}
    nvml.close()

    assert set(first) == {GPU_A, MIG_B}
    a = first[GPU_A]
    assert (a.status, a.sm_util_pct, a.processes, a.process_sm_util) == (
        "ok",
        80,
        {11: 2 * GIB, 12: 3 * GIB},
        {11: 50, 12: 30},
    )
    mig = first[MIG_B]
    assert (mig.status, mig.parent_uuid, mig.processes, mig.process_sm_util) == (
        "partial",
        GPU_B,
        {21: GIB},
        None,
    )
    assert lost[GPU_A].status == "lost" and lost[GPU_A].processes is None
    assert still[GPU_A].status == "lost" and still[MIG_B].status == "partial"
    assert back[GPU_A].status == "ok" and back[GPU_A].processes == {11: 2 * GIB, 12: 3 * GIB}
