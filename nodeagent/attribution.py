"""Which of the node's devices are a pod's, and its share of what happens on them. Pure. A device is the pod's
when a kubelet ID for the pod names it (UUID, `::n` suffix, an ID embedding it, a CDI name) or when one of
the pod's processes runs on it: the only evidence for schedulers without the kubelet (docs/nodeagent.md)."""

from __future__ import annotations

from gpuaccounting.podgpus import DeviceSource, PodGpu, PodGpus
from nodeagent.gpus import DeviceReading
from nodeagent.kubelet import PodAllocation


def allocated_uuids(allocation: PodAllocation | None, node_uuids: list[str]) -> list[str]:
    """The node's device UUIDs that the pod's kubelet-listed IDs name, longest UUID first so a MIG UUID
    is never mistaken for a GPU UUID it happens to start with."""
    if allocation is None:
        return []
    ids = allocation.device_ids + allocation.dra_devices
    by_length = sorted(node_uuids, key=len, reverse=True)
    named: dict[str, None] = {}
    for device_id in ids:
        for uuid in by_length:
            if uuid in device_id:
                named[uuid] = None
                break
    return list(named)


def _pod_measurements(reading: DeviceReading, pids: set[int]) -> tuple[float | None, int | None, int | None]:
    """(SM utilisation, memory, process count) of the pod's processes on one device."""
    if reading.processes is None:
        return None, None, None
    mine = [pid for pid in reading.processes if pid in pids]
    memory = sum(reading.processes[pid] for pid in mine)
    if reading.process_sm_util is None:
        return None, memory, len(mine)
    util = sum(value for pid, value in reading.process_sm_util.items() if pid in pids)
    return round(min(util, 100.0), 3), memory, len(mine)


def pod_gpus(
    namespace: str,
    pod: str,
    pod_uid: str,
    allocation: PodAllocation | None,
    readings: list[DeviceReading],
    pod_of_pid: dict[int, str],
) -> PodGpus:
    """The answer for one pod from one sample of the node."""
    pids = {pid for pid, uid in pod_of_pid.items() if uid == pod_uid}
    allocated = set(allocated_uuids(allocation, [r.uuid for r in readings]))
    gpus: list[PodGpu] = []
    for reading in readings:
        running_here = bool(reading.processes and pids & set(reading.processes))
        if reading.uuid not in allocated and not running_here:
            continue
        source: DeviceSource = "podresources" if reading.uuid in allocated else "processes"
        pod_util, pod_mem, pod_count = _pod_measurements(reading, pids)
        gpus.append(
            PodGpu(
                uuid=reading.uuid,
                status=reading.status,
                source=source,
                name=reading.name,
                parent_uuid=reading.parent_uuid,
                sm_util_pct=reading.sm_util_pct,
                mem_used_bytes=reading.mem_used_bytes,
                mem_total_bytes=reading.mem_total_bytes,
                energy_millijoules=reading.energy_millijoules,
                pod_sm_util_pct=pod_util,
                pod_mem_used_bytes=pod_mem,
                pod_processes=pod_count,
            )
        )
    return PodGpus(namespace=namespace, pod=pod, pod_uid=pod_uid, complete=bool(allocated), gpus=gpus)
