"""NVML's host PIDs mapped to pods through /proc/<pid>/cgroup, for both cgroup drivers and versions."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.cgroups import pod_uid_from_cgroup, pod_uid_of

UID = "0f3e5c1a-2b4d-4e6f-8a9b-0c1d2e3f4a5b"


@pytest.mark.parametrize(
    "text",
    [
        # cgroup v2, systemd driver (containerd)
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
        "cri-containerd-4f1b.scope\n",
        # cgroup v1, cgroupfs driver
        f"12:memory:/kubepods/besteffort/pod{UID}/4f1b9c\n11:cpu,cpuacct:/kubepods/besteffort/pod{UID}/4f1b9c\n",
        # guaranteed QoS has no QoS level in the path
        f"0::/kubepods/pod{UID}/4f1b9c\n",
    ],
)
def test_the_pod_uid_is_read_from_either_driver_and_version(text: str) -> None:
    assert pod_uid_from_cgroup(text) == UID


def test_a_process_outside_any_pod_or_gone_has_no_pod(tmp_path: Path) -> None:
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_text("0::/system.slice/containerd.service\n")

    assert pod_uid_of(7, tmp_path) is None
    assert pod_uid_of(8, tmp_path) is None
