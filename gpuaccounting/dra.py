"""A pod's GPUs through Dynamic Resource Allocation: at admission nothing is allocated, so a claim counts as
the largest allocation its spec allows (docs/webhook.md, "DRA pods"); which DeviceClasses are GPUs is the
catalogue's. The claim specs come from the caller: pure, standard library only."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any, Final

from gpuaccounting.catalogue import DeviceClassEntry, GpuCatalogue, SharingSystem
from gpuaccounting.quantity import QuantityError, parse_quantity
from gpuaccounting.shares import (
    JOINS_PLAIN_NVIDIA,
    GpuHardware,
    PodShare,
    Rule,
    Violation,
    below_minimum,
    mig_gpu_slices,
)

# A selector's CEL that pins a MIG device's profile. The tenant writes the CEL, and a quoted profile can be
# neutralised (`|| true`, `!=`, a ternary, a comment, a list literal around it), so only a whole expression
# of plain equalities joined by `&&` pins one: `device.attributes['gpu.nvidia.com'].profile == '1g.10gb'`,
# beside e.g. `device.attributes['gpu.nvidia.com'].type == 'mig'` or `device.driver == 'gpu.nvidia.com'`.
_QUOTED: Final = r"""(?:'[^'\\\n]*'|"[^"\\\n]*")"""
_ATTRIBUTE: Final = rf"""attributes\[\s*{_QUOTED}\s*\]\.[A-Za-z][A-Za-z0-9_]*"""
_EQUALITY: Final = rf"""device\.(?:driver|{_ATTRIBUTE})\s*==\s*{_QUOTED}"""
_CONJUNCTION: Final = re.compile(rf"""^\s*{_EQUALITY}(?:\s*&&\s*{_EQUALITY})*\s*$""")
_CONJUNCT: Final = re.compile(rf"""\s*(?:&&\s*)?({_EQUALITY})""")
_PINNED_PROFILE: Final = re.compile(
    r"""device\.attributes\[\s*['"]gpu\.nvidia\.com['"]\s*\]\.profile\s*==\s*['"]([^'"]{1,64})['"]"""
)
# `device.driver == 'gpu.nvidia.com'` in a DeviceClass's selector: a class the catalogue does not name
# that selects a GPU driver's devices is that driver's GPU class.
_DRIVER: Final = re.compile(r"""device\.driver\s*==\s*['"]([^'"]{1,253})['"]""")
MIB: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """One entry of a pod's `spec.resourceClaims`: the claim it names, or the template it is made from."""

    entry: str
    claim: str | None
    template: str | None


# What the caller knows of a claim or template: its ResourceClaimSpec, or None when it does not exist.
ClaimSpecs = Callable[[ClaimRef], Mapping[str, Any] | None]


def class_drivers(device_class: Mapping[str, Any]) -> frozenset[str]:
    """The drivers a DeviceClass's CEL selectors require (`device.driver == '...'`)."""
    spec = device_class.get("spec")
    selectors = spec.get("selectors") if isinstance(spec, dict) else None
    found: set[str] = set()
    for selector in selectors if isinstance(selectors, list) else ():
        cel = selector.get("cel") if isinstance(selector, dict) else None
        expression = cel.get("expression") if isinstance(cel, dict) else None
        if isinstance(expression, str):
            found.update(_DRIVER.findall(expression))
    return frozenset(found)


def pinned_profile(expression: object) -> str | None:
    """The MIG profile a selector's CEL expression pins every device it admits to: one of its equalities,
    where the whole expression is plain equalities joined by `&&`; None otherwise."""
    if not isinstance(expression, str) or not _CONJUNCTION.match(expression):
        return None
    position = 0
    while conjunct := _CONJUNCT.match(expression, position):  # in order, so a quoted `&&` stays quoted
        position = conjunct.end()
        if pinned := _PINNED_PROFILE.fullmatch(conjunct.group(1)):
            return pinned.group(1)
    return None


def claim_refs(pod: Mapping[str, Any]) -> list[ClaimRef]:
    """The pod's `spec.resourceClaims`, each naming a claim or a template."""
    spec = pod.get("spec")
    listed = spec.get("resourceClaims") if isinstance(spec, dict) else None
    refs = []
    for item in listed if isinstance(listed, list) else ():
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            claim, template = item.get("resourceClaimName"), item.get("resourceClaimTemplateName")
            refs.append(
                ClaimRef(
                    item["name"],
                    claim if isinstance(claim, str) else None,
                    template if isinstance(template, str) else None,
                )
            )
    return refs


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


class _ClaimReader:
    """Reads one claim spec's requests against the catalogue; collects its violations."""

    def __init__(self, hardware: GpuHardware, drivers: Mapping[str, frozenset[str]], entry: str) -> None:
        self.hardware = hardware
        self.catalogue: GpuCatalogue = hardware.catalogue
        self.drivers = drivers
        self.entry = entry
        self.violations: list[Violation] = []
        self.systems: set[SharingSystem] = set()

    def flag(self, rule: Rule, message: str, value: str) -> None:
        self.violations.append(Violation(rule, message, None, f"resourceClaim {self.entry}", value))

    def device_class(self, name: str) -> DeviceClassEntry | None:
        classes = self.catalogue.device_classes
        found = classes.get(name)
        if found is None:  # an admin's own class selecting a GPU driver's devices
            found = next((classes[d] for d in sorted(self.drivers.get(name, ())) if d in classes), None)
        # A class that names no driver may select a GPU driver's devices as well as any other's.
        any_driver = name in self.drivers and not self.drivers[name]
        if found is not None or not (any_driver or self.catalogue.looks_like_accelerator_class(name)):
            return found
        if self.catalogue.unknown_entry().known:  # unknown_accelerators: whole-gpus
            return DeviceClassEntry(SharingSystem.DEVICES)
        why = "selects devices of any driver" if any_driver else "looks like an accelerator"
        self.flag(
            Rule.UNKNOWN_ACCELERATOR,
            f'DeviceClass {name} {why} and the GPU catalogue does not name it: add "{name}"'
            ' to gpu_device_classes in the hardware configuration (e.g. {"system": "nvidia"})',
            name,
        )
        return None

    def per_device(self, request: Mapping[str, Any], device_class: DeviceClassEntry) -> Fraction:
        """One allocated device's share: a MIG profile's, or the requested consumable capacity's, else 1."""
        if device_class.system is SharingSystem.MIG:
            return self.mig_fraction(request)
        capacity = _mapping(_mapping(request.get("capacity")).get("requests"))
        fractions = [Fraction(0)]
        for name, raw in capacity.items():
            try:
                amount = Fraction(parse_quantity(raw))
            except QuantityError:
                self.flag(Rule.QUANTITY, f"capacity {name} is not a Kubernetes quantity", str(raw)[:64])
                return Fraction(1)
            whole = device_class.device_capacity(str(name))
            if whole is None and name == "memory":
                whole = Fraction(self.hardware.gpu_memory_mib * MIB)
            if whole is not None:
                fractions.append(amount / whole)
        if len(fractions) == 1:
            return Fraction(1)
        return min(max(fractions), Fraction(1))

    def mig_fraction(self, request: Mapping[str, Any]) -> Fraction:
        """The profile the request's selectors pin (each selector must hold), else a whole GPU."""
        slices = self.hardware.mig_slices_per_gpu
        held = [
            mig_gpu_slices(profile, slices) or slices
            for selector in _list(request.get("selectors"))
            if (profile := pinned_profile(_mapping(_mapping(selector).get("cel")).get("expression")))
        ]
        return Fraction(max(held, default=slices), slices)

    def request_share(self, request: Mapping[str, Any]) -> Fraction:
        """An ExactCount/All request (v1 `exactly`, a `firstAvailable` alternative, or v1beta1's own)."""
        device_class = self.device_class(str(request.get("deviceClassName", "")))
        if device_class is None or request.get("adminAccess") is True:
            return Fraction(0)
        self.systems.add(device_class.system)
        if request.get("allocationMode") == "All":
            count = Fraction(device_class.all_devices_cap)
        else:
            raw = request.get("count", 1)
            count = (
                Fraction(raw)
                if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0
                else Fraction(1)
            )
        return count * self.per_device(request, device_class)

    def claim_share(self, spec: Mapping[str, Any]) -> Fraction:
        share = Fraction(0)
        for request in _list(_mapping(spec.get("devices")).get("requests")):
            request = _mapping(request)
            if "exactly" in request:
                share += self.request_share(_mapping(request["exactly"]))
            elif "firstAvailable" in request:
                share += max(
                    (self.request_share(_mapping(a)) for a in _list(request["firstAvailable"])),
                    default=Fraction(0),
                )
            else:  # resource.k8s.io/v1beta1: the request is its own ExactCount/All request
                share += self.request_share(request)
        return share


@dataclass(frozen=True, slots=True)
class ClaimsShare:
    """The GPUs a pod's claims could at most be allocated: by which systems, which claims, what is wrong."""

    share: Fraction
    systems: frozenset[SharingSystem]
    claims: tuple[str, ...]  # the pod's resourceClaims entries that ask for GPUs
    violations: tuple[Violation, ...]


NO_CLAIMS: Final = ClaimsShare(Fraction(0), frozenset(), (), ())


def read_claims(
    pod: Mapping[str, Any],
    specs: ClaimSpecs,
    hardware: GpuHardware,
    drivers: Mapping[str, frozenset[str]] | None = None,
) -> ClaimsShare:
    """Read every claim the pod names; one that does not exist (yet) is a violation: its GPUs are unknown."""
    refs = claim_refs(pod)
    if not refs:
        return NO_CLAIMS
    share = Fraction(0)
    systems: set[SharingSystem] = set()
    claims: list[str] = []
    violations: list[Violation] = []
    for ref in refs:
        reader = _ClaimReader(hardware, drivers or {}, ref.entry)
        spec = specs(ref)
        if spec is None:
            what = f"ResourceClaim {ref.claim}" if ref.claim else f"ResourceClaimTemplate {ref.template}"
            reader.flag(
                Rule.DRA_CLAIM,
                f"{what} does not exist (yet), so the GPUs it asks for cannot be known; create it first",
                ref.claim or ref.template or "",
            )
            violations.extend(reader.violations)
            continue
        claim_share = reader.claim_share(spec)
        violations.extend(reader.violations)
        if reader.systems:
            share += claim_share
            systems.update(reader.systems)
            claims.append(ref.entry)
    return ClaimsShare(share, frozenset(systems), tuple(claims), tuple(violations))


def with_claims(share: PodShare, claims: ClaimsShare, hardware: GpuHardware) -> PodShare:
    """The pod's share with its claims' added: one pod, one set of systems, one list of violations, one
    floor (`minimum_shares`) for the whole share."""
    if claims is NO_CLAIMS:
        return share
    systems = set(share.systems) | claims.systems
    if len(systems) > 1 and systems & JOINS_PLAIN_NVIDIA:
        systems.discard(SharingSystem.NVIDIA)
    judged_again = (Rule.SINGLE_SYSTEM, Rule.MINIMUM_SHARE)
    violations = [v for v in share.violations if v.rule not in judged_again] + list(claims.violations)
    if len(systems) > 1:
        violations.append(
            Violation(
                Rule.SINGLE_SYSTEM,
                "a pod may use one GPU-sharing system, this one uses " + ", ".join(sorted(systems)),
            )
        )
    ordered = tuple(sorted(systems))
    system = share.system if share.system in systems else (ordered[0] if ordered else None)
    total = share.share + claims.share
    if system is not None and (below := below_minimum(system, total, hardware)) is not None:
        violations.append(below)
    return replace(
        share,
        system=system,
        share=total,
        systems=ordered,
        claims=claims.claims,
        violations=tuple(violations),
    )


def drivers_of(device_classes: Iterable[Mapping[str, Any]]) -> dict[str, frozenset[str]]:
    """Each DeviceClass's name with the drivers its selectors require."""
    return {str(_mapping(item.get("metadata")).get("name")): class_drivers(item) for item in device_classes}
