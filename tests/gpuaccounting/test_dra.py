"""A pod's DRA claims as the GPUs they could at most be allocated, for claims shaped like NVIDIA's DRA driver
quickstart (gpu-test1..6, MIG) and HAMi's consumable-capacity claims; a missing claim is a violation."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from gpuaccounting.catalogue import GpuCatalogue, UnknownAccelerators
from gpuaccounting.dra import ClaimRef, drivers_of, read_claims, with_claims
from gpuaccounting.shares import GpuHardware, Rule, SharingSystem, format_share, read_pod
from tests.support.dra import (
    DEVICE_CLASSES,
    HAMI_CLASS,
    NVIDIA_GPU_CLASS,
    QUICKSTART,
    SINGLE_GPU,
    claim_spec,
    claiming_pod,
    device_class,
    exactly,
    request,
)
from tests.support.pods import container, pod

HARDWARE = GpuHardware()
DRIVERS = drivers_of(DEVICE_CLASSES)


def specs_of(found: dict[str, dict[str, Any]]) -> Any:
    return lambda ref: found.get(ref.claim or ref.template or "")


def read(spec: dict[str, Any] | None, **kwargs: Any) -> Any:
    claims = read_claims(
        claiming_pod("team-a", templates={"gpu": "tpl"}),
        specs_of({"tpl": spec} if spec else {}),
        HARDWARE,
        **kwargs,
    )
    return with_claims(read_pod(claiming_pod("team-a", templates={"gpu": "tpl"}), HARDWARE), claims, HARDWARE)


@pytest.mark.parametrize("case", sorted(QUICKSTART))
def test_a_claim_counts_as_the_largest_allocation_its_spec_allows(case: str) -> None:
    spec, share = QUICKSTART[case]
    result = read(spec, drivers=DRIVERS)
    assert result.violations == ()
    assert format_share(result.share) == share
    assert result.uses_gpu and result.claims == ("gpu",)


def test_each_system_is_the_device_class_system() -> None:
    assert read(SINGLE_GPU).system is SharingSystem.NVIDIA
    assert read(QUICKSTART["gpu-test6"][0]).system is SharingSystem.MIG
    assert read(QUICKSTART["hami-cores"][0]).system is SharingSystem.HAMI


def test_a_mig_request_without_a_profile_counts_as_a_whole_gpu() -> None:
    assert read(claim_spec(request("mig", "mig.nvidia.com"))).share == 1


PROFILE = "device.attributes['gpu.nvidia.com'].profile"


@pytest.mark.parametrize(
    ("expression", "share"),
    [
        (f"{PROFILE} == '1g.10gb'", Fraction(1, 7)),
        (f"device.attributes['gpu.nvidia.com'].type == 'mig' && {PROFILE} == '3g.40gb'", Fraction(3, 7)),
        (f"{PROFILE} == '1g.10gb+me'", Fraction(1, 7)),
        # The tenant writes the CEL: a quoted small profile that does not bind the device is a whole GPU.
        (f"{PROFILE} == '1g.10gb' || true", Fraction(1)),
        (f"{PROFILE} != '1g.10gb'", Fraction(1)),
        (f"!({PROFILE} == '1g.10gb')", Fraction(1)),
        (f"{PROFILE} == '7g.80gb' ? true : {PROFILE} == '1g.10gb'", Fraction(1)),
        (f"{PROFILE}.startsWith('1g.10gb')", Fraction(1)),
        (f"'1g.10gb' in [{PROFILE}, 'x'] || {PROFILE} == '1g.10gb'", Fraction(1)),
        (f"[true, false && {PROFILE} == '1g.10gb' && true][0]", Fraction(1)),
        (f"true // && {PROFILE} == '1g.10gb'", Fraction(1)),
        (f"{PROFILE} == '1g.10gb' == false", Fraction(1)),
        (f"device.driver == \"{PROFILE} == '1g.10gb'\"", Fraction(1)),
    ],
)
def test_a_mig_request_counts_the_profile_its_selector_pins_every_device_to(
    expression: str, share: Fraction
) -> None:
    selectors = [{"cel": {"expression": expression}}]
    assert read(claim_spec(request("mig", "mig.nvidia.com", selectors=selectors))).share == share


def test_admin_access_asks_for_no_gpu_time() -> None:
    result = read(claim_spec(request("debug", NVIDIA_GPU_CLASS, adminAccess=True)))
    assert not result.uses_gpu and result.claims == ()


def test_a_v1beta1_request_is_its_own_exact_count_request() -> None:
    assert read(claim_spec({"name": "gpus", **exactly(NVIDIA_GPU_CLASS, count=3)})).share == 3


def test_a_claim_of_other_devices_leaves_the_pod_a_non_gpu_pod() -> None:
    assert not read(claim_spec(request("nic", "sriov-nic.example.com"))).uses_gpu


def test_an_admins_own_class_selecting_a_gpu_driver_counts_as_that_drivers_gpus() -> None:
    own = device_class(
        "a100-only",
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].productName == 'A100'",
    )
    result = read(claim_spec(request("gpu", "a100-only", count=2)), drivers=drivers_of([own]))
    assert (result.system, result.share, result.violations) == (SharingSystem.NVIDIA, Fraction(2), ())


def test_a_class_that_names_no_driver_may_select_gpus_and_is_denied_until_catalogued() -> None:
    everything = device_class("everything", "device.attributes.exists(a, true)")
    result = read(claim_spec(request("any", "everything")), drivers=drivers_of([everything]))
    (violation,) = result.violations
    assert violation.rule is Rule.UNKNOWN_ACCELERATOR
    assert "selects devices of any driver" in violation.describe()
    nic = device_class("nic", "device.driver == 'sriov.example.com'")
    assert read(claim_spec(request("nic", "nic")), drivers=drivers_of([nic])).violations == ()


def test_a_claim_or_template_that_does_not_exist_fails_closed() -> None:
    result = read(None)
    (violation,) = result.violations
    assert violation.rule is Rule.DRA_CLAIM
    assert "ResourceClaimTemplate tpl does not exist" in violation.describe()
    named = read_claims(claiming_pod("team-a", claims={"shared": "single-gpu"}), specs_of({}), HARDWARE)
    assert "ResourceClaim single-gpu does not exist" in named.violations[0].describe()


def test_an_accelerator_class_the_catalogue_does_not_name_is_denied_with_the_key_to_add() -> None:
    result = read(claim_spec(request("gpu", "gpu.amd.com")))
    (violation,) = result.violations
    assert violation.rule is Rule.UNKNOWN_ACCELERATOR
    assert 'add "gpu.amd.com" to gpu_device_classes' in violation.describe()


def test_claims_add_to_device_plugin_gpus_and_two_systems_are_one_too_many() -> None:
    both = claiming_pod("team-a", templates={"gpu": "tpl"})
    both["spec"]["containers"][0]["resources"]["limits"] = {
        "tencent.com/vcuda-core": 50,
        "tencent.com/vcuda-memory": 4,
    }
    result = with_claims(
        read_pod(both, HARDWARE), read_claims(both, specs_of({"tpl": SINGLE_GPU}), HARDWARE), HARDWARE
    )
    assert result.share == Fraction(3, 2)
    assert [v.rule for v in result.violations] == [Rule.SINGLE_SYSTEM]


def test_the_implicit_extended_resource_of_a_gpu_class_counts_whole_gpus() -> None:
    implicit = read_pod(
        pod(container("main", {f"deviceclass.resource.kubernetes.io/{NVIDIA_GPU_CLASS}": 2})), HARDWARE
    )
    assert (implicit.system, implicit.share, implicit.violations) == (SharingSystem.NVIDIA, Fraction(2), ())
    hami = read_pod(pod(container("main", {f"deviceclass.resource.kubernetes.io/{HAMI_CLASS}": 1})), HARDWARE)
    assert (hami.share, hami.violations) == (Fraction(1), ())
    amd = read_pod(pod(container("main", {"deviceclass.resource.kubernetes.io/gpu.amd.com": 1})), HARDWARE)
    assert [v.rule for v in amd.violations] == [Rule.UNKNOWN_ACCELERATOR]


def test_claim_refs_read_only_well_formed_entries() -> None:
    built = pod(
        container("main"), resourceClaims=[{"name": "a", "resourceClaimName": "c"}, "junk", {"name": 3}]
    )
    claims = read_claims(built, lambda ref: SINGLE_GPU if ref == ClaimRef("a", "c", None) else None, HARDWARE)
    assert (claims.share, claims.claims) == (1, ("a",))


def test_under_whole_gpus_an_unknown_accelerator_class_is_charged_not_denied() -> None:
    hardware = GpuHardware(catalogue=GpuCatalogue(unknown=UnknownAccelerators.WHOLE_GPUS))
    spec = claim_spec(request("gpu", "gpu.amd.com", count=2))
    built = claiming_pod("team-a", templates={"gpu": "tpl"})
    result = with_claims(
        read_pod(built, hardware), read_claims(built, specs_of({"tpl": spec}), hardware), hardware
    )
    assert (result.system, result.share, result.violations) == (SharingSystem.DEVICES, Fraction(2), ())
    implicit = read_pod(
        pod(container("main", {"deviceclass.resource.kubernetes.io/gpu.amd.com": 1})), hardware
    )
    assert (implicit.share, implicit.violations) == (Fraction(1), ())


TINY_HAMI = claim_spec(request("gpu", HAMI_CLASS, capacity={"requests": {"memory": "1Mi"}}))


def test_a_claim_below_its_systems_floor_is_a_minimum_share_violation() -> None:
    result = read(TINY_HAMI)
    assert (result.system, result.share) == (SharingSystem.HAMI, Fraction(1, HARDWARE.gpu_memory_mib))
    (violation,) = result.violations
    assert violation.rule is Rule.MINIMUM_SHARE
    assert "for hami, 0.01 (hardware file: minimum_shares)" in violation.describe()


def test_the_floor_is_judged_on_the_device_plugin_share_and_the_claims_together() -> None:
    """1 MiB through HAMi's device plugin is below the floor alone, not beside a claim of 30 % of a GPU."""
    built = claiming_pod("team-a", templates={"gpu": "tpl"})
    built["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1}
    alone = read_pod(built, HARDWARE)
    assert [v.rule for v in alone.violations] == [Rule.MINIMUM_SHARE]
    spec = claim_spec(request("gpu", HAMI_CLASS, capacity={"requests": {"cores": 30}}))
    result = with_claims(alone, read_claims(built, specs_of({"tpl": spec}), HARDWARE), HARDWARE)
    assert (result.system, result.share) == (SharingSystem.HAMI, Fraction(3, 10) + alone.share)
    assert result.violations == ()
    tiny = with_claims(alone, read_claims(built, specs_of({"tpl": TINY_HAMI}), HARDWARE), HARDWARE)
    assert [v.rule for v in tiny.violations] == [Rule.MINIMUM_SHARE]
