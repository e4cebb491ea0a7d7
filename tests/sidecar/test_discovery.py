"""Which GPUs are the pod's: NVIDIA_VISIBLE_DEVICES first, then HAMi or gpushare annotations read from
the downward-API volume, else allocation only."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.discovery import (
    discover,
    parse_hami_allocation,
    parse_visible_devices,
    read_downward_file,
)
from sidecar.gpus import Selector

GPU_A = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"
GPU_B = "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec"
MIG_A = "MIG-2f7fd6ad-1b2c-5c3c-9f5e-0123456789ab"


@pytest.mark.parametrize("value", [None, "", "  ", "void", "none", "NONE"])
def test_visible_devices_that_name_no_gpu_leave_the_question_open(value: str | None) -> None:
    assert parse_visible_devices(value) is None


def test_visible_devices_all_selects_every_device() -> None:
    assert parse_visible_devices("all") == (Selector("all"),)


def test_visible_devices_list_of_uuids_mig_uuids_and_indices() -> None:
    assert parse_visible_devices(f"{GPU_A}, {MIG_A},1,0:2,bogus") == (
        Selector("uuid", GPU_A),
        Selector("uuid", MIG_A),
        Selector("index", "1"),
        Selector("index", "0:2"),
    )


def test_time_slicing_replica_ids_are_stripped_to_their_device() -> None:
    assert parse_visible_devices(f"{MIG_A}::3,{GPU_A}::0,{GPU_A}::1") == (
        Selector("uuid", MIG_A),
        Selector("uuid", GPU_A),
    )
    assert parse_hami_allocation(f"{GPU_B}::2,NVIDIA,3000,30:;") == (Selector("uuid", GPU_B),)


def test_downward_file_values_are_unquoted(tmp_path: Path) -> None:
    (tmp_path / "annotations").write_text(
        'gpu-timekeeper.io/gpu-share="0.5"\n'
        'kubernetes.io/config.seen="2026-11-22T00:00:00Z"\n'
        'quoted="say \\"hi\\"\\nbye"\n'
        "not a pair\n"
    )

    values = read_downward_file(tmp_path / "annotations")

    assert values == {
        "gpu-timekeeper.io/gpu-share": "0.5",
        "kubernetes.io/config.seen": "2026-11-22T00:00:00Z",
        "quoted": 'say "hi"\nbye',
    }


def test_downward_file_missing_reads_as_empty(tmp_path: Path) -> None:
    assert read_downward_file(tmp_path / "absent") == {}


def test_hami_allocation_lists_every_containers_devices_once() -> None:
    value = f"{GPU_A},NVIDIA,3000,30:{GPU_B},NVIDIA,3000,30:;{GPU_A},NVIDIA,1000,0:;"

    assert parse_hami_allocation(value) == (Selector("uuid", GPU_A), Selector("uuid", GPU_B))


def _podinfo(tmp_path: Path, **annotations: str) -> Path:
    lines = "".join(f'{key}="{value}"\n' for key, value in annotations.items())
    (tmp_path / "annotations").write_text(lines)
    return tmp_path


def test_visible_devices_win_over_annotations(tmp_path: Path) -> None:
    podinfo = _podinfo(tmp_path, **{"hami.io/vgpu-devices-allocated": f"{GPU_B},NVIDIA,3000,30:;"})

    found = discover(GPU_A, podinfo)

    assert found.strategy == "nvidia_visible_devices"
    assert found.selectors == (Selector("uuid", GPU_A),)


def test_hami_annotation_answers_when_visible_devices_say_none(tmp_path: Path) -> None:
    podinfo = _podinfo(tmp_path, **{"hami.io/vgpu-devices-allocated": f"{GPU_B},NVIDIA,3000,30:;"})

    found = discover("none", podinfo)

    assert found.strategy == "hami_annotation"
    assert found.selectors == (Selector("uuid", GPU_B),)


def test_gpushare_index_annotation(tmp_path: Path) -> None:
    podinfo = _podinfo(tmp_path, ALIYUN_COM_GPU_MEM_IDX="1", ALIYUN_COM_GPU_MEM_ASSIGNED="true")

    found = discover(None, podinfo)

    assert found.strategy == "gpushare_annotation"
    assert found.selectors == (Selector("index", "1"),)


def test_nothing_known_falls_back_to_allocation_only(tmp_path: Path) -> None:
    podinfo = _podinfo(tmp_path, **{"hami.io/vgpu-devices-allocated": ";"})

    assert discover("void", podinfo).strategy == "allocation_only"
    assert discover(None, None).selectors == ()
