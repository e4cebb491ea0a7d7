"""Which pod a host process belongs to, from its cgroup path (NVML reports host PIDs).

The kubelet puts every container of a pod under a cgroup named after the pod's UID, with either cgroup
driver and either cgroup version:
    cgroupfs: /kubepods/burstable/pod0f3e.../<container id>
    systemd:  /kubepods.slice/.../kubepods-burstable-pod0f3e..._.slice/cri-containerd-....scope
`/proc/<pid>/cgroup` is world-readable, so the agent needs hostPID but no capability to read it.
"""

from __future__ import annotations

import re
from pathlib import Path

_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


def pod_uid_from_cgroup(text: str) -> str | None:
    """The pod UID in a `/proc/<pid>/cgroup` file's text (the systemd driver's underscores made dashes)."""
    for line in text.splitlines():
        found = _POD_UID.search(line.rpartition(":")[2])
        if found:
            return found.group(1).replace("_", "-")
    return None


def pod_uid_of(pid: int, proc_root: Path) -> str | None:
    """The pod UID of a host process; None for a process outside any pod or one that already exited."""
    try:
        return pod_uid_from_cgroup((proc_root / str(pid) / "cgroup").read_text(encoding="utf-8"))
    except OSError:
        return None
