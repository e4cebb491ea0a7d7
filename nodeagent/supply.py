"""Whether this node's NVIDIA Container Toolkit hands GPUs to an unprivileged container for its
NVIDIA_VISIBLE_DEVICES alone (`accept-nvidia-visible-devices-envvar-when-unprivileged`, true by default):
the route by which any container that sets the variable, or whose image does, gets GPUs it never asked the
device plugin for (docs/security.md, "The GPU supply on a node"). The agent asks for its own GPUs that way
(deployment/nodeagent), so what it sees is the answer, read without any further access to the node."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gpuaccounting.supply import DEVICE_LIST_ROOTS, NO_DEVICE_VALUES

CAP_SYS_ADMIN = 21  # the bit of CapEff in /proc/<pid>/status


def _privileged(status: str) -> bool:
    """CAP_SYS_ADMIN in the effective set: the toolkit honours the variable for such a container anyway."""
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_SYS_ADMIN & 1)
    return False


def _device_list_mounted(mountinfo: str) -> bool:
    """A mount under the toolkit's volume-mount device list: the devices may have come that way."""
    points = (line.split()[4] for line in mountinfo.splitlines() if len(line.split()) > 4)
    return any(
        point == root or point.startswith(root + "/") for point in points for root in DEVICE_LIST_ROOTS
    )


def env_route_open(environ: Mapping[str, str], devices: int, status: str, mountinfo: str) -> bool:
    """True only with proof: the agent, unprivileged and without a device-list mount, asked for GPUs by
    the variable and sees `devices` > 0. False is no proof of the contrary (NVML may be away)."""
    asked = environ.get("NVIDIA_VISIBLE_DEVICES", "").strip().lower() not in NO_DEVICE_VALUES
    return asked and devices > 0 and not _privileged(status) and not _device_list_mounted(mountinfo)


def probe(environ: Mapping[str, str], devices: int, proc_self: Path = Path("/proc/self")) -> bool:
    """`env_route_open` for this process."""
    try:
        status = (proc_self / "status").read_text()
        mountinfo = (proc_self / "mountinfo").read_text()
    except OSError:
        return False
    return env_route_open(environ, devices, status, mountinfo)
