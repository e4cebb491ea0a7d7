"""A pod's sharing system and GPU share, for every row of the brief's table, and what each system forbids."""

from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest

from gpuaccounting.catalogue import DEFAULT_GPU_RESOURCES, GpuCatalogue, GpuEntry, UnknownAccelerators
from gpuaccounting.shares import (
    SMALLEST_MINIMUM_SHARE,
    GpuHardware,
    PodShare,
    Rule,
    SharingSystem,
    format_share,
    read_pod,
)
from tests.support.pods import container, pod

HARDWARE = GpuHardware(gpu_memory_mib=40960, mig_slices_per_gpu=7, metagpu_units_per_gpu=100)


def share_of(*containers: dict[str, Any], hardware: GpuHardware = HARDWARE, **kwargs: Any) -> PodShare:
    return read_pod(pod(*containers, **kwargs), hardware)


def rules(result: PodShare) -> set[Rule]:
    return {violation.rule for violation in result.violations}


@pytest.mark.parametrize(
    ("requests", "system", "share"),
    [
        ({"nvidia.com/gpu": 2}, SharingSystem.NVIDIA, Fraction(2)),
        ({"nvidia.com/gpu": "1"}, SharingSystem.NVIDIA, Fraction(1)),
        ({"nvidia.com/gpu": "1000m"}, SharingSystem.NVIDIA, Fraction(1)),
        ({"nvidia.com/mig-3g.20gb": 1}, SharingSystem.MIG, Fraction(3, 7)),
        ({"nvidia.com/mig-1g.10gb": "2"}, SharingSystem.MIG, Fraction(2, 7)),
        ({"nvidia.com/mig-1g.10gb+me": 1}, SharingSystem.MIG, Fraction(1, 7)),
        ({"tencent.com/vcuda-core": 50, "tencent.com/vcuda-memory": 8}, SharingSystem.VCUDA, Fraction(1, 2)),
        (
            {"tencent.com/vcuda-core": "200", "tencent.com/vcuda-memory": "4"},
            SharingSystem.VCUDA,
            Fraction(2),
        ),
        ({"cnvrg.io/metagpu": 25}, SharingSystem.METAGPU, Fraction(1, 4)),
        ({"aliyun.com/gpu-mem": 10}, SharingSystem.GPUSHARE, Fraction(1, 4)),
        ({"aliyun.com/gpu-mem": 20, "aliyun.com/gpu-count": 1}, SharingSystem.GPUSHARE, Fraction(1, 2)),
        ({"nvidia.com/gpu": 2, "nvidia.com/gpucores": 30}, SharingSystem.HAMI, Fraction(3, 5)),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 10240}, SharingSystem.HAMI, Fraction(1, 4)),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50}, SharingSystem.HAMI, Fraction(1, 2)),
        (
            {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 20, "nvidia.com/gpumem": 30000},
            SharingSystem.HAMI,
            Fraction(1, 5),
        ),
        ({"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-cores": 50}, SharingSystem.VOLCANO, Fraction(1, 2)),
        (
            {"volcano.sh/vgpu-number": 2, "volcano.sh/vgpu-memory": 4096},
            SharingSystem.VOLCANO,
            Fraction(1, 5),
        ),
        ({"volcano.sh/vgpu-number": 1}, SharingSystem.VOLCANO, Fraction(1)),
        (
            {"volcano.sh/vgpu-number": 2, "volcano.sh/vgpu-memory-percentage": 25},
            SharingSystem.VOLCANO,
            Fraction(1, 2),
        ),
        (
            {"aliyun.com/gpu-mem": 4, "aliyun.com/gpu-core.percentage": 30},
            SharingSystem.GPUSHARE,
            Fraction(3, 10),
        ),
        (
            {"aliyun.com/gpu-mem": 20, "aliyun.com/gpu-core.percentage": 30},
            SharingSystem.GPUSHARE,
            Fraction(1, 2),
        ),
    ],
)
def test_container_resources_give_system_and_share(
    requests: dict[str, Any], system: SharingSystem, share: Fraction
) -> None:
    result = share_of(container("main", {"cpu": "1", **requests}))
    assert result.violations == ()
    assert (result.system, result.share) == (system, share)


def test_time_slicing_replicas_divide_whole_gpus() -> None:
    sliced = GpuHardware(time_slicing_replicas=4)
    assert share_of(container("a", {"nvidia.com/gpu": 2}), hardware=sliced).share == Fraction(1, 2)


def test_renamed_time_slicing_divides_only_the_shared_resource() -> None:
    renamed = GpuHardware(time_slicing_replicas=4, time_slicing_renamed=True)
    whole = share_of(container("a", {"nvidia.com/gpu": 1}), hardware=renamed)
    shared = share_of(container("a", {"nvidia.com/gpu.shared": 1}), hardware=renamed)
    assert (whole.share, shared.share) == (Fraction(1), Fraction(1, 4))


def test_a_limit_without_a_request_is_requested_at_the_limit() -> None:
    limited = {"name": "a", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "3"}}}
    assert share_of(limited).share == 3


def test_clearml_label_gives_the_fraction() -> None:
    result = share_of(labels={"clearml-injector/fraction": "0.125"})
    assert (result.system, result.share, result.violations) == (SharingSystem.CLEARML, Fraction(1, 8), ())


def test_clearml_whole_numbers_are_allowed() -> None:
    assert share_of(labels={"clearml-injector/fraction": "2"}).share == 2


@pytest.mark.parametrize("value", ["0.3", "0", "-0.5", "half", "1.5"])
def test_clearml_fraction_outside_the_allowed_set_is_a_violation(value: str) -> None:
    result = share_of(labels={"clearml-injector/fraction": value})
    # A value read as no share at all is below every floor too.
    floor = {Rule.MINIMUM_SHARE} if result.share == 0 else set()
    assert rules(result) == {Rule.CLEARML_FRACTION, *floor}
    assert value in result.violations[0].describe()


def test_kai_fraction_and_memory() -> None:
    fraction = share_of(annotations={"gpu-fraction": "0.5"})
    memory = share_of(annotations={"gpu-memory": "20480"})
    devices = share_of(annotations={"gpu-fraction": "0.25", "gpu-fraction-num-devices": "2"})
    assert (fraction.system, fraction.share) == (SharingSystem.KAI, Fraction(1, 2))
    assert (memory.system, memory.share) == (SharingSystem.KAI, Fraction(1, 2))
    assert devices.share == Fraction(1, 2)


def test_kai_rules() -> None:
    assert rules(share_of(annotations={"gpu-fraction": "1.5"})) == {Rule.KAI_FRACTION, Rule.MINIMUM_SHARE}
    assert rules(share_of(annotations={"gpu-fraction": "0.5", "gpu-memory": "100"})) == {Rule.KAI_FRACTION}
    named = share_of(annotations={"gpu-fraction": "0.5", "gpu-fraction-container-name": "nope"})
    assert rules(named) == {Rule.KAI_CONTAINER}
    assert (
        share_of(annotations={"gpu-fraction": "0.5", "gpu-fraction-container-name": "main"}).violations == ()
    )


def test_effective_request_takes_the_larger_of_init_and_app_containers() -> None:
    result = share_of(
        container("app-1", {"nvidia.com/gpu": 1}),
        container("app-2", {"nvidia.com/gpu": 1}),
        init=(container("warmup", {"nvidia.com/gpu": 3}), container("small", {"nvidia.com/gpu": 1})),
    )
    assert result.share == 3


def test_restartable_init_containers_add_to_app_containers_and_to_later_init_containers() -> None:
    # Kubernetes: a sidecar (restartable init container) runs beside every later init container and the app.
    result = share_of(
        container("app", {"nvidia.com/gpu": 1}),
        init=(
            container("sidecar", {"nvidia.com/gpu": 1}, restartable=True),
            container("warmup", {"nvidia.com/gpu": 2}),
        ),
    )
    assert result.share == 3  # warmup (2) beside the sidecar (1) > app (1) + sidecar (1)
    assert (
        share_of(
            container("app", {"nvidia.com/gpu": 2}),
            init=(container("sidecar", {"nvidia.com/gpu": 1}, restartable=True),),
        ).share
        == 3
    )


def test_non_gpu_pod_has_no_system_and_no_share() -> None:
    result = share_of(container("web", {"cpu": "250m", "memory": "64Mi"}))
    assert (result.uses_gpu, result.share, result.violations) == (False, 0, ())


def test_zero_requests_ask_for_nothing() -> None:
    assert share_of(container("web", {"nvidia.com/gpu": 0})).uses_gpu is False


def test_skipped_container_is_left_out() -> None:
    result = read_pod(
        pod(container("app", {"nvidia.com/gpu": 1}), container("ours", {"nvidia.com/gpu": 5})),
        HARDWARE,
        skip_container="ours",
    )
    assert result.share == 1


@pytest.mark.parametrize(
    ("requests", "rule", "mentions"),
    [
        ({"tencent.com/vcuda-core": 150, "tencent.com/vcuda-memory": 8}, Rule.VCUDA_CORE_RANGE, "150"),
        ({"tencent.com/vcuda-core": 50}, Rule.VCUDA_PAIRING, "tencent.com/vcuda-memory is missing"),
        ({"tencent.com/vcuda-memory": 8}, Rule.VCUDA_PAIRING, "tencent.com/vcuda-core is missing"),
        ({"tencent.com/vcuda-core": "500m", "tencent.com/vcuda-memory": 8}, Rule.POSITIVE_INTEGER, "500m"),
        ({"nvidia.com/gpu": "500m"}, Rule.POSITIVE_INTEGER, "nvidia.com/gpu=500m"),
        ({"nvidia.com/mig-9g.90gb": 1}, Rule.MIG_PROFILE, "nvidia.com/mig-9g.90gb"),
        ({"nvidia.com/mig-weird": 1}, Rule.MIG_PROFILE, "nvidia.com/mig-weird"),
        ({"cnvrg.io/metagpu": "2.5"}, Rule.POSITIVE_INTEGER, "2.5"),
        ({"aliyun.com/gpu-count": 1}, Rule.DEVICE_COUNT_REQUIRED, "aliyun.com/gpu-mem"),
        ({"aliyun.com/gpu-core.percentage": 30}, Rule.DEVICE_COUNT_REQUIRED, "aliyun.com/gpu-mem"),
        ({"aliyun.com/gpu-mem": 4, "aliyun.com/gpu-core.percentage": 150}, Rule.PERCENTAGE_RANGE, "150"),
        ({"aliyun.com/gpu-mem": 100}, Rule.MEMORY_WITHIN_GPU, "40960 MiB"),
        ({"nvidia.com/gpucores": 50}, Rule.DEVICE_COUNT_REQUIRED, "nvidia.com/gpu"),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 150}, Rule.PERCENTAGE_RANGE, "150"),
        ({"nvidia.com/gpu": 1, "nvidia.com/gpumem": 50000}, Rule.MEMORY_WITHIN_GPU, "50000"),
        ({"volcano.sh/vgpu-cores": 50}, Rule.DEVICE_COUNT_REQUIRED, "volcano.sh/vgpu-number"),
        ({"nvidia.com/gpu": "lots"}, Rule.QUANTITY, "lots"),
        (
            {"cnvrg.io/metagpu": 10, "tencent.com/vcuda-core": 10, "tencent.com/vcuda-memory": 1},
            Rule.SINGLE_SYSTEM,
            "gpu-manager",
        ),
    ],
)
def test_violations_name_container_resource_value_and_rule(
    requests: dict[str, Any], rule: Rule, mentions: str
) -> None:
    result = share_of(container("trainer", requests))
    assert rule in rules(result)
    message = next(v.describe() for v in result.violations if v.rule is rule)
    assert 'container "trainer"' in message
    assert mentions in message
    assert f"(rule {rule})" in message


def test_two_systems_across_containers_is_a_violation() -> None:
    result = share_of(container("a", {"cnvrg.io/metagpu": 10}), container("b", {"nvidia.com/gpu": 1}))
    assert rules(result) == {Rule.SINGLE_SYSTEM}
    assert "metagpu, nvidia" in result.violations[0].message


def test_a_pod_level_and_a_container_system_together_is_a_violation() -> None:
    result = share_of(container("a", {"nvidia.com/gpu": 1}), annotations={"gpu-fraction": "0.5"})
    assert rules(result) == {Rule.SINGLE_SYSTEM}


def test_plain_gpus_join_hami_and_mig_pods() -> None:
    hami = share_of(
        container("a", {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 50}),
        container("b", {"nvidia.com/gpu": 1}),
    )
    mig = share_of(container("a", {"nvidia.com/gpu": 1, "nvidia.com/mig-1g.10gb": 1}))
    assert (hami.system, hami.share, hami.violations) == (SharingSystem.HAMI, Fraction(3, 2), ())
    assert (mig.system, mig.share, mig.violations) == (SharingSystem.MIG, Fraction(8, 7), ())


@pytest.mark.parametrize(
    ("share", "text"),
    [
        (Fraction(1), "1"),
        (Fraction(1, 2), "0.5"),
        (Fraction(1, 7), "0.142857"),
        (Fraction(0), "0"),
        (Fraction(3, 8), "0.375"),
    ],
)
def test_format_share(share: Fraction, text: str) -> None:
    assert format_share(share) == text


def test_malformed_pod_shapes_do_not_raise() -> None:
    assert read_pod({}).uses_gpu is False
    assert (
        read_pod({"spec": {"containers": ["not a container", {"name": "x", "resources": "no"}]}}).uses_gpu
        is False
    )


def test_a_denial_echoes_a_value_shortened_not_whole() -> None:
    huge = "1" * 100_000
    share = read_pod(pod(container("main", {"nvidia.com/gpu": huge})))

    (violation, floor) = share.violations
    assert (violation.rule, floor.rule) == (Rule.QUANTITY, Rule.MINIMUM_SHARE)
    assert violation.value == "1" * 63 + "…"


@pytest.mark.parametrize(
    ("requests", "share"),
    [
        ({"nvidia.com/gpu-0": 4}, Fraction(1, 2)),  # ClearML's CFGI: 8 time-slicing replicas of GPU 0
        ({"nvidia.com/gpu-1": "8"}, Fraction(1)),
        ({"nvidia.com/gpu-0": 1, "nvidia.com/gpu-1": 1}, Fraction(1, 4)),
    ],
)
def test_renamed_nvidia_resources_are_counted_by_the_shipped_pattern(
    requests: dict[str, Any], share: Fraction
) -> None:
    result = share_of(container("main", requests))
    assert (result.system, result.share, result.violations) == (SharingSystem.CLEARML, share, ())


def test_a_clearml_label_beside_renamed_replicas_is_at_least_the_replicas() -> None:
    labelled = {"clearml-injector/fraction": "0.125"}
    result = share_of(container("main", {"nvidia.com/gpu-0": 4}), labels=labelled)
    assert (result.system, result.share, result.violations) == (SharingSystem.CLEARML, Fraction(1, 2), ())


@pytest.mark.parametrize(
    "resource", ["amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe", "example.com/my-gpu"]
)
def test_an_accelerator_the_catalogue_does_not_name_is_denied_with_the_key_to_add(resource: str) -> None:
    result = share_of(container("main", {resource: 1}))
    assert result.uses_gpu and result.share == 1
    (violation,) = result.violations
    assert violation.rule is Rule.UNKNOWN_ACCELERATOR
    assert f'add "{resource}" to gpu_resources' in violation.describe()


def test_an_accelerator_added_to_the_catalogue_is_counted_without_a_violation() -> None:
    amd = GpuEntry(SharingSystem.DEVICES, 1)
    hardware = GpuHardware(catalogue=GpuCatalogue(resources={**DEFAULT_GPU_RESOURCES, "amd.com/gpu": amd}))
    result = share_of(container("main", {"amd.com/gpu": 2}), hardware=hardware)
    assert (result.system, result.share, result.violations) == (SharingSystem.DEVICES, Fraction(2), ())


def test_unknown_accelerators_may_be_charged_as_whole_gpus_instead() -> None:
    hardware = GpuHardware(catalogue=GpuCatalogue(unknown=UnknownAccelerators.WHOLE_GPUS))
    result = share_of(container("main", {"amd.com/gpu": 3}), hardware=hardware)
    assert (result.system, result.share, result.violations) == (SharingSystem.DEVICES, Fraction(3), ())


def test_resources_that_are_no_accelerator_leave_the_pod_a_non_gpu_pod() -> None:
    requests = {"cpu": "2", "memory": "1Gi", "hugepages-2Mi": "1Gi", "example.com/fpga-nic": 1, "rdma/hca": 1}
    assert not share_of(container("main", requests)).uses_gpu


def test_an_exact_entry_wins_over_a_pattern_and_the_longest_pattern_over_a_shorter_one() -> None:
    catalogue = GpuCatalogue(
        resources={**DEFAULT_GPU_RESOURCES, "nvidia.com/gpu-big": GpuEntry(SharingSystem.NVIDIA, 1)},
        patterns={
            "nvidia.com/gpu-*": GpuEntry(SharingSystem.NVIDIA, 2),
            "nvidia.com/gpu-x*": GpuEntry(SharingSystem.NVIDIA, 4),
        },
    )
    hardware = GpuHardware(catalogue=catalogue)
    shares = [
        share_of(container("a", {name: 4}), hardware=hardware).share
        for name in ("nvidia.com/gpu-big", "nvidia.com/gpu-0", "nvidia.com/gpu-x1")
    ]
    assert shares == [4, 2, 1]


# The names NVIDIA's device plugin advertises (`nvidia.com/mig-` + go-nvlib's profile string) for A100-40GB,
# H100-80GB, H200 and B200, with the attributes newer GPUs add (+me, +me.all, +gfx, -me); and the
# compute-instance profiles mig-parted and the DRA driver accept ([<c>c.]<g>g.<gb>gb).
@pytest.mark.parametrize(
    ("profile", "slices"),
    [
        ("1g.5gb", 1), ("1g.5gb+me", 1), ("1g.10gb", 1), ("2g.10gb", 2), ("3g.20gb", 3), ("4g.20gb", 4),
        ("7g.40gb", 7), ("1g.10gb+me", 1), ("1g.20gb", 1), ("3g.40gb", 3), ("7g.80gb", 7), ("1g.18gb+me", 1),
        ("3g.71gb", 3), ("7g.141gb", 7), ("1g.23gb", 1), ("2g.45gb", 2), ("7g.180gb", 7),
        ("1g.24gb+me.all", 1), ("1g.24gb-me", 1), ("2g.48gb+gfx", 2), ("1g.24gb+gfx", 1),
        ("1c.2g.20gb", 2), ("1c.3g.40gb", 3), ("2c.7g.80gb", 7), ("1c.1g.10gb+me", 1),
    ],
)  # fmt: skip
def test_every_mig_name_nvidias_tools_advertise_is_accepted_at_its_gpu_instance(
    profile: str, slices: int
) -> None:
    result = share_of(container("main", {f"nvidia.com/mig-{profile}": 2}))
    assert (result.system, result.share, result.violations) == (
        SharingSystem.MIG,
        Fraction(2 * slices, 7),
        (),
    )


@pytest.mark.parametrize(
    "profile",
    ["8g.80gb", "0g.5gb", "3c.2g.20gb", "1g.5gb+", "1g.5gb+me-me", "1g.5gb+1me", "1g", "1c.1c.1g.5gb", "mig"],
)
def test_a_name_that_is_no_mig_profile_is_denied(profile: str) -> None:
    result = share_of(container("main", {f"nvidia.com/mig-{profile}": 1}))
    # Read as no share at all, so below every floor too.
    assert [violation.rule for violation in result.violations] == [Rule.MIG_PROFILE, Rule.MINIMUM_SHARE]


@pytest.mark.parametrize(
    ("where", "system", "floor"),
    [
        ({"annotations": {"gpu-fraction": "0.0000001"}}, "kai", "0.01"),
        ({"annotations": {"gpu-fraction": "0.000001"}}, "kai", "0.01"),
        ({"annotations": {"gpu-memory": "1"}}, "kai", "0.01"),
        ({"requests": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1}}, "hami", "0.01"),
        ({"requests": {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 1}}, "volcano-vgpu", "0.01"),
        ({"requests": {"aliyun.com/gpu-mem": 1}, "unit": 1}, "aliyun-gpushare", "0.001"),
        ({"requests": {"cnvrg.io/metagpu": 1}, "units": 1000}, "metagpu", "0.01"),
    ],
)
def test_a_share_below_its_systems_floor_is_a_violation_naming_the_floor(
    where: dict[str, Any], system: str, floor: str
) -> None:
    """Issue 25: a share that rounds to nothing (or runs a GPU for ~nothing) is never admitted."""
    hardware = GpuHardware(
        gpushare_memory_unit_mib=where.get("unit", 1024), metagpu_units_per_gpu=where.get("units", 100)
    )
    asked = pod(container("main", where.get("requests")), annotations=where.get("annotations"))
    result = read_pod(asked, hardware)
    assert result.system == system
    [violation] = [v for v in result.violations if v.rule is Rule.MINIMUM_SHARE]
    assert f"for {system}, {floor} (hardware file: minimum_shares)" in violation.message
    assert result.violations == (violation,)


def test_a_share_at_its_floor_is_admitted_and_every_floor_formats_above_zero() -> None:
    assert read_pod(pod(container("main"), annotations={"gpu-fraction": "0.01"})).violations == ()
    assert (
        read_pod(
            pod(container("main", {"nvidia.com/gpu": 1})), GpuHardware(time_slicing_replicas=1000)
        ).violations
        == ()
    )
    for system in SharingSystem:
        assert format_share(GpuHardware().minimum_share(system)) != "0"
    assert format_share(SMALLEST_MINIMUM_SHARE) == "0.000001"


def test_the_report_schema_accepts_every_share_a_floor_admits() -> None:
    """The smallest floor a hardware file may set is a share the timekeeper's reports accept."""
    from timekeeper.usage.schemas import MIN_GPU_SHARE

    assert Decimal(SMALLEST_MINIMUM_SHARE.numerator) / SMALLEST_MINIMUM_SHARE.denominator >= MIN_GPU_SHARE
