"""What a Dynamic Resource Allocation claim is charged (its allocated devices at each one's share and weight,
for the time any consumer ran; never the claim the scheduler made for a pod's extended resources, which
that pod's admitted share counts), decided without the API server or the database. The rule in full:
docs/timekeeper.md, "DRA claims"."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from fractions import Fraction
from typing import Any, Final

from gpuaccounting.catalogue import GpuCatalogue, SharingSystem
from gpuaccounting.quantity import QuantityError, parse_quantity
from gpuaccounting.shares import GpuHardware, mig_gpu_slices
from timekeeper.domain.periods import Interval
from timekeeper.domain.weights import model_key
from timekeeper.reconcile.pods import TrackedPod

CLAIM_POD_PREFIX: Final = "claim."  # a claim's rows in the ledger: `claim.<name>` beside the pods' names

DeviceKey = tuple[str, str, str]  # driver, pool, device


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


@dataclass(frozen=True, slots=True)
class Device:
    """A device a ResourceSlice publishes: its attributes (names without the driver's domain) and
    capacities, as strings."""

    attributes: Mapping[str, str]
    capacity: Mapping[str, str]


def _attribute_value(raw: object) -> str | None:
    value = _mapping(raw)
    for kind in ("string", "version", "int", "bool"):
        if kind in value:
            return str(value[kind])
    return None


@dataclass(frozen=True, slots=True)
class SliceDevices:
    """The published devices by (driver, pool, device name), and by `uuid` (a MIG device's parent)."""

    by_key: Mapping[DeviceKey, Device]
    by_uuid: Mapping[str, Device]


def slice_devices(slices: Iterable[Mapping[str, Any]]) -> SliceDevices:
    """Every device the ResourceSlices publish."""
    found: dict[DeviceKey, Device] = {}
    for item in slices:
        spec = _mapping(item.get("spec"))
        driver, pool = str(spec.get("driver", "")), str(_mapping(spec.get("pool")).get("name", ""))
        for device in _list(spec.get("devices")):
            device = _mapping(device)
            body = _mapping(device.get("basic")) or device  # v1beta1 nests a device's fields in `basic`
            attributes = {
                str(name).rsplit("/", 1)[-1]: value
                for name, raw in _mapping(body.get("attributes")).items()
                if (value := _attribute_value(raw)) is not None
            }
            capacity = {
                str(name).rsplit("/", 1)[-1]: str(_mapping(raw).get("value", raw))
                for name, raw in _mapping(body.get("capacity")).items()
            }
            found[driver, pool, str(device.get("name", ""))] = Device(attributes, capacity)
    by_uuid = {d.attributes["uuid"]: d for d in found.values() if "uuid" in d.attributes}
    return SliceDevices(found, by_uuid)


@dataclass(frozen=True, slots=True)
class ClaimPart:
    """A claim's devices of one GPU model: charged as one coverage row (`key`), at `share` GPUs."""

    key: str
    model: str | None
    share: Decimal


def _request_classes(claim: Mapping[str, Any]) -> dict[str, str]:
    """Each request's DeviceClass by the name a result gives it (`req`, or `req/alternative`)."""
    classes: dict[str, str] = {}
    for request in _list(_mapping(_mapping(claim.get("spec")).get("devices")).get("requests")):
        request = _mapping(request)
        name = str(request.get("name", ""))
        if "exactly" in request:
            classes[name] = str(_mapping(request["exactly"]).get("deviceClassName", ""))
        for alternative in _list(request.get("firstAvailable")):
            alternative = _mapping(alternative)
            classes[f"{name}/{alternative.get('name', '')}"] = str(alternative.get("deviceClassName", ""))
        if "deviceClassName" in request:  # v1beta1: the request is its own
            classes[name] = str(request["deviceClassName"])
    return classes


def _fraction(
    result: Mapping[str, Any], device: Device | None, system: SharingSystem | None, hardware: GpuHardware
) -> Fraction:
    """One allocated device's share of a GPU."""
    if result.get("adminAccess") is True:
        return Fraction(0)
    profile = device.attributes.get("profile") if device else None
    if profile is not None or system is SharingSystem.MIG:
        slices = hardware.mig_slices_per_gpu
        held = mig_gpu_slices(profile, slices) if profile else None
        return Fraction(held or slices, slices)
    consumed = _mapping(result.get("consumedCapacity"))
    fractions = []
    for name, raw in consumed.items():
        whole = device.capacity.get(str(name)) if device else None
        try:
            amount, total = Fraction(parse_quantity(raw)), Fraction(parse_quantity(whole or ""))
        except QuantityError:
            continue
        if total > 0:
            fractions.append(amount / total)
    return min(max(fractions), Fraction(1)) if fractions else Fraction(1)


def _model(device: Device | None, by_uuid: Mapping[str, Device]) -> str | None:
    """The device's GPU model: a MIG device's parent GPU's where the slices publish the parent."""
    if device is None:
        return None
    parent = by_uuid.get(device.attributes.get("parentUUID", ""))
    name = (parent or device).attributes.get("productName")
    return model_key(name) if name else None


def claim_parts(claim: Mapping[str, Any], devices: SliceDevices, hardware: GpuHardware) -> list[ClaimPart]:
    """The claim's GPU devices as allocated, grouped by model (most claims have one); none for a claim
    with no allocation or no GPU devices. Its annotations are the tenant's: they decide nothing."""
    metadata = _mapping(claim.get("metadata"))
    classes = _request_classes(claim)
    entries = hardware.catalogue.device_classes
    shares: dict[str | None, Fraction] = {}
    allocation = _mapping(_mapping(claim.get("status")).get("allocation"))
    for result in _list(_mapping(allocation.get("devices")).get("results")):
        result = _mapping(result)
        driver = str(result.get("driver", ""))
        entry = entries.get(classes.get(str(result.get("request", "")), "")) or entries.get(driver)
        if entry is None:
            continue  # not a GPU (a NIC, say): the catalogue names the GPU classes and drivers
        device = devices.by_key.get((driver, str(result.get("pool", "")), str(result.get("device", ""))))
        model = _model(device, devices.by_uuid)
        shares[model] = shares.get(model, Fraction(0)) + _fraction(result, device, entry.system, hardware)
    uid = str(metadata.get("uid", ""))
    ordered = sorted(shares.items(), key=lambda item: item[0] or "")
    return [
        ClaimPart(
            uid if index == 0 else f"{uid}-{index}", model, Decimal(share.numerator) / share.denominator
        )
        for index, (model, share) in enumerate(ordered)
        if share > 0
    ]


def merged(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of the intervals, as disjoint intervals in time order."""
    union: list[Interval] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if union and start <= union[-1][1]:
            union[-1] = (union[-1][0], max(union[-1][1], end))
        else:
            union.append((start, end))
    return union


@dataclass(slots=True)
class TrackedClaim:
    """A claim as last listed, with every pod seen reserving it (the scheduler removes ended pods from
    `reservedFor`; their time is still the claim's)."""

    namespace: str
    name: str
    parts: list[ClaimPart]
    consumers: set[str] = field(default_factory=set)
    listed: bool = True  # False: gone from the API; forgotten once its final charge is done


def consumer_uids(claim: Mapping[str, Any]) -> set[str]:
    return {
        str(_mapping(ref).get("uid"))
        for ref in _list(_mapping(claim.get("status")).get("reservedFor"))
        if _mapping(ref).get("resource", "pods") == "pods" and _mapping(ref).get("uid")
    }


def pod_claim_names(pod: Mapping[str, Any]) -> set[str]:
    """The claims a pod uses by name: those it names, and those made for it from templates."""
    spec, status = _mapping(pod.get("spec")), _mapping(pod.get("status"))
    names = {_mapping(entry).get("resourceClaimName") for entry in _list(spec.get("resourceClaims"))}
    names |= {
        _mapping(entry).get("resourceClaimName") for entry in _list(status.get("resourceClaimStatuses"))
    }
    return {str(name) for name in names if name}


def extended_resource_claim(pod: TrackedPod, catalogue: GpuCatalogue) -> str | None:
    """The claim the scheduler made for the pod's extended resources (`status.extendedResourceClaimStatus`,
    which only the scheduler writes), where the pod's admitted share already counts each of them: a share
    above 0 and every mapped resource a GPU to the catalogue. None otherwise: such a claim is charged."""
    found = _mapping(_mapping(pod.info.raw.get("status")).get("extendedResourceClaimStatus"))
    name, mappings = found.get("resourceClaimName"), _list(found.get("requestMappings"))
    if not isinstance(name, str) or not name or pod.share <= 0 or not mappings:
        return None
    resources = [_mapping(mapping).get("resourceName") for mapping in mappings]
    if not all(isinstance(resource, str) and catalogue.entry(resource) for resource in resources):
        return None
    return name


class ClaimConsumers:
    """The tracked pods by uid, by the claims they name in their namespace, and by the extended-resource
    claim the scheduler made for them."""

    def __init__(self, pods: Iterable[TrackedPod], catalogue: GpuCatalogue) -> None:
        self._pods = {pod.info.uid: pod for pod in pods}
        self._naming: dict[tuple[str, str], set[str]] = {}
        self._extended: dict[tuple[str, str], set[str]] = {}
        for pod in self._pods.values():
            for name in pod_claim_names(pod.info.raw):
                self._naming.setdefault((pod.info.namespace, name), set()).add(pod.info.uid)
            if (extended := extended_resource_claim(pod, catalogue)) is not None:
                self._extended.setdefault((pod.info.namespace, extended), set()).add(pod.info.uid)

    def of(self, claim: TrackedClaim) -> list[TrackedPod]:
        """The claim's consumers: the pods seen reserving it and those naming it."""
        uids = claim.consumers | self._naming.get((claim.namespace, claim.name), set())
        return [self._pods[uid] for uid in sorted(uids) if uid in self._pods]

    def charged_to_pods(self, claim: TrackedClaim, users: list[TrackedPod]) -> bool:
        """Whether the claim is the scheduler's for its consumers' extended resources, which their admitted
        shares count: every consumer is a pod the scheduler made it for, and their shares are at least
        the claim's devices (a time-sliced `nvidia.com/gpu` counted 1/4 may be given a whole device by a
        DRA driver). A claim any other pod uses (one made again under a freed name, say) is the claim's."""
        made_for = self._extended.get((claim.namespace, claim.name), set())
        if not users or not all(pod.info.uid in made_for for pod in users):
            return False
        return sum((part.share for part in claim.parts), Decimal(0)) <= sum(
            (pod.share for pod in users), Decimal(0)
        )


def ran(pods: Iterable[TrackedPod], until: datetime) -> list[Interval]:
    """When any of the pods ran: each started pod from its start to its end, or to `until` while running."""
    return merged(
        (pod.info.started_at, pod.ended_at or until)
        for pod in pods
        if pod.info.started_at is not None and (pod.running or pod.ended_at is not None)
    )


class ClaimRegistry:
    """Allocated GPU claims by uid, kept by the leader's passes (one list of claims and slices each) and
    the claims watch between them (a claim made and deleted between two passes is still seen)."""

    def __init__(self) -> None:
        self._claims: dict[str, TrackedClaim] = {}
        self._watched: dict[str, Mapping[str, Any]] = {}  # each claim as the watch last saw it
        self._reserved: dict[str, set[str]] = {}  # the pods the watch saw in each claim's reservedFor

    def reset(self) -> None:
        self._claims.clear()
        self._watched.clear()
        self._reserved.clear()

    def observe(self, claim: Mapping[str, Any]) -> None:
        """A watch event's claim (deleted ones too), read at the next pass: its last allocated state (a
        claim is deallocated before it is deleted) and every pod seen reserving it."""
        uid = str(_mapping(claim.get("metadata")).get("uid", ""))
        allocation = _mapping(_mapping(claim.get("status")).get("allocation"))
        if uid not in self._watched or _list(_mapping(allocation.get("devices")).get("results")):
            self._watched[uid] = claim
        self._reserved.setdefault(uid, set()).update(consumer_uids(claim))

    def update(
        self, claims: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]], hardware: GpuHardware
    ) -> None:
        """A fresh list: new and changed claims read anew, consumers added, missing ones marked gone (with
        those only the watch saw since the last pass)."""
        devices = slice_devices(slices)
        listed = {str(_mapping(claim.get("metadata")).get("uid", "")): claim for claim in claims}
        watched, reserved = self._watched, self._reserved
        self._watched, self._reserved = {}, {}
        seen = set()
        for uid, claim in (watched | listed).items():
            metadata = _mapping(claim.get("metadata"))
            parts = claim_parts(claim, devices, hardware)
            tracked = self._claims.get(uid)
            if not parts and tracked is None:
                continue
            if uid in listed:
                seen.add(uid)
            if tracked is None:
                tracked = self._claims[uid] = TrackedClaim(
                    str(metadata.get("namespace", "")), str(metadata.get("name", "")), parts
                )
            elif parts:
                tracked.parts = parts
            tracked.listed = uid in listed
            tracked.consumers |= consumer_uids(claim) | reserved.get(uid, set())
        for uid in self._claims.keys() - seen:
            self._claims[uid].listed = False

    def seen(self, uid: str) -> bool:
        """Whether a pass or the watch has seen the claim."""
        return uid in self._claims or uid in self._watched

    def claims(self) -> dict[str, TrackedClaim]:
        return dict(self._claims)

    def forget(self, uid: str) -> None:
        self._claims.pop(uid, None)
