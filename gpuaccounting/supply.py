"""The node's GPU supply beside the device plugin: the ways a pod's spec can have the container runtime and
the NVIDIA stack hand a container a GPU it never asked for as a resource (docs/security.md, "The GPU supply
on a node"). This module finds each use of such a route in a pod; whether a route is refused, and where it
is allowed, is the hardware file's (`gpu_supply_routes`, `gpu_supply_exempt`, `gpu_runtime_classes`), read
by gpuaccounting.hardware. Pure, standard library only."""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final


class SupplyRoute(StrEnum):
    """A route to a GPU outside the device plugin and DRA, named as the hardware file names it."""

    VISIBLE_DEVICES_ENV = "visible-devices-env"  # NVIDIA_VISIBLE_DEVICES or a sibling in a container's env
    DEVICE_LIST_MOUNT = "device-list-mount"  # a mount under /var/run/nvidia-container-devices
    CDI_ANNOTATION = "cdi-annotation"  # a pod annotation that CDI or NRI injectors read as a device request
    GPU_RUNTIME_CLASS = "gpu-runtime-class"  # the toolkit's runtime for a pod that asks for no GPU
    DEVICE_HOST_PATH = "device-host-path"  # a hostPath volume of device nodes or the driver's root
    PRIVILEGED = "privileged"  # every host device, and the toolkit honours the env variables regardless


class RouteMode(StrEnum):
    REFUSE = "refuse"  # the default: the pod is denied, the message naming the route and the node setting
    ALLOW = "allow"  # the admin's word that the nodes ignore this route (docs/deployment.md)


# What the NVIDIA Container Toolkit reads as a device request from a container's environment
# (nvidia-container-toolkit internal/config/image/envvars.go): the GPUs, the MIG configuration and
# monitoring capabilities of GPUs, and IMEX channels.
DEVICE_VARIABLES: Final = frozenset(
    {
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_MIG_CONFIG_DEVICES",
        "NVIDIA_MIG_MONITOR_DEVICES",
        "NVIDIA_IMEX_CHANNELS",
    }
)
# A "legacy" image's variable: where a container sets CUDA_VERSION and neither NVIDIA_VISIBLE_DEVICES nor
# NVIDIA_REQUIRE_CUDA, the toolkit hands it every GPU (internal/config/image/cuda_image.go, IsLegacy). The
# device plugin sets NVIDIA_VISIBLE_DEVICES in the containers it serves, so this is a route for a pod that
# asks for no GPU.
LEGACY_VARIABLE: Final = "CUDA_VERSION"
# Values that ask for no device: the toolkit reads unset, empty and "void" as none; "none" gives the
# driver's libraries without a device node.
NO_DEVICE_VALUES: Final = frozenset({"", "void", "none"})
# The toolkit's volume-mount device list (`accept-nvidia-visible-devices-as-volume-mounts`), and /run, which
# /var/run is a link to on the hosts the toolkit supports.
DEVICE_LIST_ROOTS: Final = ("/var/run/nvidia-container-devices", "/run/nvidia-container-devices")
# Pod annotation keys that device injectors read: CDI's `cdi.k8s.io/` (containerd and CRI-O pass them on
# where configured), the toolkit's NRI plugin's `nvidia.cdi.k8s.io/`, NRI's device injector's devices, CDI
# devices and host mounts under its keys old and new (containerd/nri plugins/device-injector), and NRI's CDI
# device injector's `cdi.nri.io/`.
CDI_ANNOTATION_PREFIXES: Final = (
    "cdi.k8s.io/",
    "nvidia.cdi.k8s.io/",
    "devices.nri.io",
    "devices.noderesource.dev",
    "cdi-devices.nri.io",
    "cdi-devices.noderesource.dev",
    "mounts.nri.io",
    "mounts.noderesource.dev",
    "cdi.nri.io/",
)
# Host paths that hand over a GPU's device nodes in a hostPath volume: /dev/nvidia* (the GPUs, nvidiactl,
# nvidia-uvm, nvidia-caps), /dev/dri (render nodes), /dev/null (the source the volume-mount device list
# reads) and the GPU Operator's driver root; an ancestor of one ("/", "/dev") hands it over too.
DEVICE_HOST_PATHS: Final = ("/dev/dri", "/dev/null", "/run/nvidia", "/var/run/nvidia")
NVIDIA_DEVICE_NODES: Final = "/dev/nvidia"
# Capabilities that lift a container's device limits (mounting, device cgroups) as privilege does.
PRIVILEGED_CAPABILITIES: Final = frozenset({"ALL", "SYS_ADMIN", "CAP_SYS_ADMIN"})
# The RuntimeClasses the NVIDIA GPU Operator and `nvidia-ctk runtime configure` create, and k3s's and
# RKE2's `nvidia-experimental`.
DEFAULT_RUNTIME_CLASSES: Final = frozenset({"nvidia", "nvidia-cdi", "nvidia-legacy", "nvidia-experimental"})
# Who may use every route: the GPU Operator's and the NVIDIA device plugin's usual namespaces, kube-system,
# and our node agent by its namespace and ServiceAccount (its NVML needs every GPU of its node).
DEFAULT_EXEMPT: Final[Mapping[str, frozenset[str]]] = {
    "kube-system": frozenset({"*"}),
    "gpu-operator": frozenset({"*"}),
    "nvidia-gpu-operator": frozenset({"*"}),
    "nvidia-device-plugin": frozenset({"*"}),
    "gpu-timekeeper-node": frozenset({"gpu-timekeeper-nodeagent"}),
}

# For each route, the node setting that makes it work: what the refusal names, so the admin knows what to
# change on the nodes instead of allowing it (docs/deployment.md, "Closing the GPU supply on the nodes").
NODE_SETTINGS: Final[Mapping[SupplyRoute, str]] = {
    SupplyRoute.VISIBLE_DEVICES_ENV: "the NVIDIA Container Toolkit's"
    " accept-nvidia-visible-devices-envvar-when-unprivileged, true by default",
    SupplyRoute.DEVICE_LIST_MOUNT: "the NVIDIA Container Toolkit's"
    " accept-nvidia-visible-devices-as-volume-mounts",
    SupplyRoute.CDI_ANNOTATION: "the container runtime's CDI annotations (containerd pod_annotations, CRI-O"
    " allowed_annotations) or an NRI device plugin",
    SupplyRoute.GPU_RUNTIME_CLASS: "the NVIDIA runtime, which honours an image's own NVIDIA_VISIBLE_DEVICES"
    " where accept-nvidia-visible-devices-envvar-when-unprivileged is true",
    SupplyRoute.DEVICE_HOST_PATH: "hostPath volumes, which Pod Security's baseline level refuses",
    SupplyRoute.PRIVILEGED: "privileged containers, which Pod Security's baseline level refuses",
}


@dataclass(frozen=True, slots=True)
class RouteUse:
    """One use of a route: where in the pod (a container, or the pod itself) and what it wrote."""

    route: SupplyRoute
    field: str  # e.g. "env NVIDIA_VISIBLE_DEVICES", "annotation cdi.k8s.io/x", "runtimeClassName"
    value: str
    container: str | None = None


@dataclass(frozen=True, slots=True)
class GpuSupply:
    """The admin's policy: the routes allowed everywhere, who is exempt from all of them (namespace to
    ServiceAccounts, "*" for any), and the RuntimeClasses that run the NVIDIA runtime."""

    allowed: frozenset[SupplyRoute] = frozenset()
    exempt: tuple[tuple[str, frozenset[str]], ...] = tuple(sorted(DEFAULT_EXEMPT.items()))
    runtime_classes: frozenset[str] = DEFAULT_RUNTIME_CLASSES

    def exempts(self, namespace: str, service_account: str) -> bool:
        accounts = next((names for named, names in self.exempt if named == namespace), frozenset())
        return "*" in accounts or service_account in accounts


DEFAULT_SUPPLY: Final = GpuSupply()


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _containers(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from (c for c in _list(spec.get(key)) if isinstance(c, dict))


def _clean(path: str) -> str:
    """`path` as the runtime cleans it (Go's filepath.Clean): absolute, no `..`, `.` or doubled slash."""
    return "/" + posixpath.normpath("/" + path).lstrip("/")


def _under(path: object, roots: tuple[str, ...]) -> bool:
    """Whether `path` is one of `roots` or inside one."""
    if not isinstance(path, str):
        return False
    clean = _clean(path)
    return any(clean == root or clean.startswith(root + "/") for root in roots)


def _device_host_path(path: object) -> bool:
    """Whether a hostPath volume of `path` may hold a GPU's device nodes: one of them, an ancestor, or a
    path the host resolves elsewhere (`..` after a link such as /var/run, /proc/<pid>/root)."""
    if not isinstance(path, str):
        return False
    clean = _clean(path)
    if ".." in path.split("/") or _under(clean, ("/proc",)):
        return True
    ancestor = clean.rstrip("/") + "/"
    return (
        _under(clean, DEVICE_HOST_PATHS)
        or clean.startswith(NVIDIA_DEVICE_NODES)
        or any(root.startswith(ancestor) for root in (*DEVICE_HOST_PATHS, NVIDIA_DEVICE_NODES))
    )


def _container_uses(container: Mapping[str, Any], uses: list[RouteUse], *, asks_for_gpu: bool) -> None:
    """Append the container's uses to `uses`. Cheap for the common container: only what names a route is
    looked at further (this runs for every pod /validate sees)."""
    name = str(container.get("name"))
    variables = DEVICE_VARIABLES if asks_for_gpu else DEVICE_VARIABLES | {LEGACY_VARIABLE}
    for variable in _list(container.get("env")):
        if not isinstance(variable, dict) or variable.get("name") not in variables:
            continue
        field = f"env {variable['name']}"
        value = variable.get("value")
        text = value.strip() if isinstance(value, str) else ""
        if "valueFrom" in variable:
            uses.append(RouteUse(SupplyRoute.VISIBLE_DEVICES_ENV, field, "valueFrom", name))
        elif text if variable["name"] == LEGACY_VARIABLE else text.lower() not in NO_DEVICE_VALUES:
            uses.append(RouteUse(SupplyRoute.VISIBLE_DEVICES_ENV, field, text, name))
    for source in _list(container.get("envFrom")):
        # A prefix that may make a ConfigMap's or Secret's key a device variable; an empty prefix is the
        # image's ENV case (invisible here: docs/security.md, S9).
        prefix = source.get("prefix") if isinstance(source, dict) else None
        if isinstance(prefix, str) and prefix and any(v.startswith(prefix) for v in variables):
            uses.append(RouteUse(SupplyRoute.VISIBLE_DEVICES_ENV, "envFrom prefix", prefix, name))
    for mount in _list(container.get("volumeMounts")):
        path = mount.get("mountPath") if isinstance(mount, dict) else None
        # The toolkit takes any mount path that starts with its root, without a slash after it.
        if (
            isinstance(path, str)
            and "nvidia-container-devices" in path
            and _clean(path).startswith(DEVICE_LIST_ROOTS)
        ):
            uses.append(RouteUse(SupplyRoute.DEVICE_LIST_MOUNT, "volumeMount", path, name))
    security = _mapping(container.get("securityContext"))
    if security.get("privileged") is True:
        uses.append(RouteUse(SupplyRoute.PRIVILEGED, "securityContext.privileged", "true", name))
    if "capabilities" in security:
        added = {str(c).upper() for c in _list(_mapping(security["capabilities"]).get("add"))}
        for capability in sorted(added & PRIVILEGED_CAPABILITIES):
            uses.append(
                RouteUse(SupplyRoute.PRIVILEGED, "securityContext.capabilities.add", capability, name)
            )


def route_uses(pod: Mapping[str, Any], supply: GpuSupply, *, asks_for_gpu: bool) -> list[RouteUse]:
    """Every use of a route in `pod`, whatever the policy. `asks_for_gpu`: the pod asks for a GPU as a
    resource, a DRA claim or a sharing system's marker (then the NVIDIA runtime class is its due)."""
    spec = _mapping(pod.get("spec"))
    annotations = _mapping(_mapping(pod.get("metadata")).get("annotations"))
    uses: list[RouteUse] = []
    for container in _containers(spec):
        _container_uses(container, uses, asks_for_gpu=asks_for_gpu)
    for key in sorted(annotations):
        if key.startswith(CDI_ANNOTATION_PREFIXES):
            uses.append(RouteUse(SupplyRoute.CDI_ANNOTATION, f"annotation {key}", str(annotations[key])))
    runtime_class = spec.get("runtimeClassName")
    if not asks_for_gpu and runtime_class in supply.runtime_classes:
        uses.append(RouteUse(SupplyRoute.GPU_RUNTIME_CLASS, "runtimeClassName", str(runtime_class)))
    for volume in _list(spec.get("volumes")):
        host_path = _mapping(_mapping(volume).get("hostPath")).get("path")
        if _device_host_path(host_path):
            where = f"volume {_mapping(volume).get('name')}"
            uses.append(RouteUse(SupplyRoute.DEVICE_HOST_PATH, where, str(host_path)))
    return uses


def refused_uses(
    pod: Mapping[str, Any], namespace: str, supply: GpuSupply, *, asks_for_gpu: bool
) -> list[RouteUse]:
    """The uses the policy refuses: none for an exempt namespace and ServiceAccount, none of an allowed
    route. The ServiceAccount is the one the API server's ServiceAccount admission settled on."""
    account = _mapping(pod.get("spec")).get("serviceAccountName") or "default"
    if supply.exempts(namespace, str(account)):
        return []
    return [u for u in route_uses(pod, supply, asks_for_gpu=asks_for_gpu) if u.route not in supply.allowed]
