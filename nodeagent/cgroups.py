"""Which pod a host process belongs to, from `/proc/<pid>/cgroup` (world-readable: hostPID, no capability):
the kubelet puts a pod's containers under a cgroup named after its UID, `pod<uid>` with cgroupfs and
`-pod<uid>.slice` with systemd, with either cgroup version."""

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
