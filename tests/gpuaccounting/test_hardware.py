"""The hardware file both deployables load: every key optional, nothing wrong read as a default."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from gpuaccounting.catalogue import UNKNOWN, GpuEntry, SharingSystem, UnknownAccelerators
from gpuaccounting.hardware import KEYS, HardwareConfigError, load_hardware
from gpuaccounting.shares import GpuHardware, Rule, read_pod
from tests.support.pods import container, pod

SHIPPED = Path(__file__).resolve().parents[2] / "deployment" / "base" / "hardware" / "hardware.json"


def write(tmp_path: Path, document: object) -> Path:
    path = tmp_path / "hardware.json"
    path.write_text(json.dumps(document))
    return path


def test_no_file_means_the_defaults() -> None:
    assert load_hardware(None) == GpuHardware()


def test_every_key_is_read(tmp_path: Path) -> None:
    hardware = load_hardware(
        write(
            tmp_path,
            {
                "gpu_memory_mib": 40960,
                "mig_slices_per_gpu": 4,
                "time_slicing_replicas": 4,
                "time_slicing_renamed": True,
                "metagpu_units_per_gpu": 1000,
                "gpushare_memory_unit_mib": 1,
                "clearml_fractions": ["1/2", 0.25, "1"],
            },
        )
    )
    assert hardware == GpuHardware(
        gpu_memory_mib=40960,
        mig_slices_per_gpu=4,
        time_slicing_replicas=4,
        time_slicing_renamed=True,
        metagpu_units_per_gpu=1000,
        gpushare_memory_unit_mib=1,
        clearml_fractions=frozenset({Fraction(1, 2), Fraction(1, 4), Fraction(1)}),
    )


def test_missing_keys_take_the_defaults_and_the_sizes_change_shares(tmp_path: Path) -> None:
    hardware = load_hardware(write(tmp_path, {"time_slicing_replicas": 4}))
    assert hardware == GpuHardware(time_slicing_replicas=4)
    assert read_pod(pod(container("main", {"nvidia.com/gpu": 1})), hardware).share == Fraction(1, 4)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"gpu_memory": 40960}, "unknown keys \\['gpu_memory'\\]"),
        ({"gpu_memory_mib": "40960"}, "gpu_memory_mib must be a positive integer"),
        ({"mig_slices_per_gpu": 0}, "mig_slices_per_gpu must be a positive integer"),
        ({"time_slicing_replicas": True}, "time_slicing_replicas must be a positive integer"),
        ({"metagpu_units_per_gpu": 2.5}, "metagpu_units_per_gpu must be a positive integer"),
        ({"time_slicing_renamed": "false"}, "time_slicing_renamed must be true or false"),
        ({"clearml_fractions": []}, "clearml_fractions must be a non-empty list"),
        ({"clearml_fractions": ["a/b"]}, "'a/b' is not a fraction"),
        ({"clearml_fractions": ["1/0"]}, "'1/0' is not a fraction"),
        ({"clearml_fractions": ["-1/2"]}, "'-1/2' is not above zero"),
        ([1, 2], "must be a JSON object"),
        ({"minimum_shares": ["kai"]}, "minimum_shares must be an object"),
        ({"minimum_shares": {"runai": "1/100"}}, "'runai' is no sharing system"),
        (
            {"minimum_shares": {"kai": "1/10000000"}},
            "minimum_shares.kai: '1/10000000' is not between 1/1000000 and 1",
        ),
        ({"minimum_shares": {"kai": 0}}, "minimum_shares.kai: 0 is not between"),
        ({"minimum_shares": {"kai": 2}}, "minimum_shares.kai: 2 is not between"),
        ({"minimum_shares": {"kai": "tiny"}}, "minimum_shares.kai: 'tiny' is not a fraction"),
    ],
)
def test_a_wrong_value_is_refused_with_its_key(tmp_path: Path, document: object, message: str) -> None:
    path = write(tmp_path, document)
    with pytest.raises(HardwareConfigError, match=message) as raised:
        load_hardware(path)
    assert str(path) in str(raised.value)


def test_a_file_that_is_not_json_or_not_there_is_refused(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{gpu_memory_mib: 1}")
    with pytest.raises(HardwareConfigError, match=r"broken\.json"):
        load_hardware(broken)
    with pytest.raises(HardwareConfigError, match=r"absent\.json"):
        load_hardware(tmp_path / "absent.json")


def test_the_shipped_file_states_the_defaults() -> None:
    """deployment/'s ConfigMap is the file operators edit: it lists every key, at the defaults."""
    document = json.loads(SHIPPED.read_text())
    assert set(document) == KEYS == {
        "gpu_memory_mib", "mig_slices_per_gpu", "time_slicing_replicas", "time_slicing_renamed",
        "metagpu_units_per_gpu", "gpushare_memory_unit_mib", "clearml_fractions", "minimum_shares",
        "gpu_resources", "gpu_resource_patterns", "gpu_device_classes", "accelerator_patterns",
        "unknown_accelerators", "non_gpu_resources", "vgpu_board_memory_gb", "gpu_supply_routes",
        "gpu_supply_exempt", "gpu_runtime_classes", "gpu_node_pools", "mig_profile_models",
    }  # fmt: skip
    assert set(document["minimum_shares"]) == {system.value for system in SharingSystem}
    assert load_hardware(SHIPPED) == GpuHardware()


def test_the_catalogue_keys_are_read(tmp_path: Path) -> None:
    hardware = load_hardware(
        write(
            tmp_path,
            {
                "gpu_resources": {
                    "amd.com/gpu": {"system": "devices"},
                    "nvidia.com/gpu": {"system": "nvidia"},
                },
                "gpu_resource_patterns": {"nvidia.com/a100-*": {"system": "nvidia", "units_per_gpu": 4}},
                "gpu_device_classes": {"gpu.example.com": {"system": "hami", "capacity": {"cores": 100}}},
                "accelerator_patterns": ["*accel*"],
                "unknown_accelerators": "whole-gpus",
            },
        )
    )
    catalogue = hardware.catalogue
    assert catalogue.entry("amd.com/gpu") == GpuEntry(SharingSystem.DEVICES)
    assert catalogue.entry("nvidia.com/a100-0") == GpuEntry(SharingSystem.NVIDIA, 4)
    assert catalogue.entry("nvidia.com/gpucores") is None  # the file's gpu_resources replace the defaults
    assert catalogue.entry("example.com/accelerator") == GpuEntry(SharingSystem.DEVICES, 1)
    assert catalogue.device_classes["gpu.example.com"].device_capacity("cores") == 100
    assert catalogue.unknown is UnknownAccelerators.WHOLE_GPUS


def test_what_is_no_gpu_and_the_vgpu_boards_are_read(tmp_path: Path) -> None:
    """An admin's own no-GPU names under a GPU vendor's domain, and a vGPU board the defaults lack."""
    hardware = load_hardware(
        write(
            tmp_path,
            {"non_gpu_resources": ["nvidia.com/sriov_*"], "vgpu_board_memory_gb": {"RTXA6000": 48}},
        )
    )

    assert hardware.catalogue.entry("nvidia.com/sriov_rdma") is None
    assert hardware.catalogue.entry("nvidia.com/hostdev") == UNKNOWN  # the file's list replaces the default
    assert hardware.catalogue.vgpu_boards == {"RTXA6000": 48}


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"gpu_resources": []}, "gpu_resources must be an object"),
        (
            {"gpu_resources": {"amd.com/gpu": {"system": "amd"}}},
            r"gpu_resources\['amd.com/gpu'\].system must be",
        ),
        ({"gpu_resources": {"amd.com/gpu": {"system": "devices", "units": 1}}}, r"unknown keys \['units'\]"),
        (
            {"gpu_resources": {"a.com/gpu": {"system": "devices", "units_per_gpu": 0}}},
            "must be a positive integer",
        ),
        ({"gpu_resources": {"a.com/cores": {"system": "hami"}}}, "hami reads only its own resources"),
        (
            {"gpu_resources": {"nvidia.com/gpucores": {"system": "hami", "units_per_gpu": 2}}},
            "only for counted",
        ),
        (
            {"gpu_resource_patterns": {"x.com/*": {"system": "metagpu"}}},
            "metagpu reads only its own resources",
        ),
        ({"gpu_resources": {"x.com/kai": {"system": "kai"}}}, r"pod annotations only"),
        ({"gpu_device_classes": {"g": {"system": "nvidia", "capacity": {"cores": 0}}}}, "is not above zero"),
        ({"accelerator_patterns": "*gpu*"}, "must be a list of name patterns"),
        ({"unknown_accelerators": "allow"}, "unknown_accelerators must be one of"),
        ({"non_gpu_resources": ["nvidia.com/hostdev", ""]}, "must be a list of name patterns"),
        ({"vgpu_board_memory_gb": {"A10": 0}}, r"vgpu_board_memory_gb.A10 must be a positive integer"),
        ({"vgpu_board_memory_gb": ["A10"]}, "vgpu_board_memory_gb must be an object"),
    ],
)
def test_a_wrong_catalogue_entry_is_refused_with_its_key(
    tmp_path: Path, document: object, message: str
) -> None:
    with pytest.raises(HardwareConfigError, match=message):
        load_hardware(write(tmp_path, document))


def test_minimum_shares_names_only_the_floors_that_change(tmp_path: Path) -> None:
    hardware = load_hardware(write(tmp_path, {"minimum_shares": {"kai": "1/1000", "hami": 0.05}}))
    assert hardware.minimum_share(SharingSystem.KAI) == Fraction(1, 1000)
    assert hardware.minimum_share(SharingSystem.HAMI) == Fraction(1, 20)
    assert hardware.minimum_share(SharingSystem.METAGPU) == GpuHardware().minimum_share(SharingSystem.METAGPU)
    lowered = read_pod(pod(container("main"), annotations={"gpu-fraction": "0.005"}), hardware)
    assert lowered.violations == ()
    refused = read_pod(pod(container("main"), annotations={"gpu-fraction": "0.0005"}), hardware)
    assert [v.rule for v in refused.violations] == [Rule.MINIMUM_SHARE]
