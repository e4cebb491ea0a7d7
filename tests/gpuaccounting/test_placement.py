"""Which GPU models a pod can land on, read as the scheduler will honour its spec, and conservative wherever
it is not read exactly (issue 41): what a tenant writes can only narrow what we believe."""

from __future__ import annotations

from typing import Any

import pytest

from gpuaccounting.gpumodels import (
    DEFAULT_GPU_MODELS,
    NVIDIA_MIG_PROFILE_MODELS,
    gpu_models,
    model_key,
    model_match_key,
    same_model,
)
from gpuaccounting.hardware import parse_hardware
from gpuaccounting.placement import PRODUCT_LABEL, Placement, claim_models, expression_models, pod_models

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"
T4 = "Tesla-T4"


def required(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
    }


def term(*expressions: dict[str, Any]) -> dict[str, Any]:
    return {"matchExpressions": list(expressions)}


def product(operator: str, *values: str) -> dict[str, Any]:
    built: dict[str, Any] = {"key": PRODUCT_LABEL, "operator": operator}
    if operator in ("In", "NotIn"):
        built["values"] = list(values)
    return built


def models(spec: dict[str, Any], **kwargs: Any) -> Placement:
    return pod_models(spec, kwargs.pop("catalogue", DEFAULT_GPU_MODELS), **kwargs)


def test_model_spellings_meet_in_one_match_key() -> None:
    assert model_key("NVIDIA H100 80GB HBM3") == H100
    assert same_model("nvidia h100 80gb hbm3", H100)
    assert model_match_key(" NVIDIA_H100__80GB-HBM3 ") == model_match_key(H100)


def test_a_node_selector_on_the_product_pins_the_model() -> None:
    placement = models({"nodeSelector": {PRODUCT_LABEL: H100}})
    assert placement.open_to(H100) and not placement.open_to(A100)
    assert not placement.beyond([H100])


@pytest.mark.parametrize(
    "spelling", ["nvidia-h100-80gb-hbm3", "NVIDIA H100 80GB HBM3", "NVIDIA_H100_80GB_HBM3"]
)
def test_a_selected_model_in_another_spelling_is_the_same_model(spelling: str) -> None:
    assert models({"nodeSelector": {PRODUCT_LABEL: spelling}}).open_to(H100)
    assert models({"affinity": required(term(product("In", spelling)))}).open_to(H100)


def test_required_terms_are_ored_and_their_expressions_anded() -> None:
    placement = models(
        {
            "affinity": required(
                term(product("In", H100, A100), product("NotIn", H100)), term(product("In", T4))
            )
        }
    )
    assert not placement.open_to(H100)
    assert placement.open_to(A100) and placement.open_to(T4)


@pytest.mark.parametrize(
    "affinity",
    [
        required(term(product("NotIn"))),  # NotIn nothing
        required(term(product("NotIn", A100))),  # NotIn another model
        required(term(product("Exists"))),
        required(term(product("DoesNotExist"))),
        required(
            term(product("In", A100)), term({"key": "zone", "operator": "In", "values": ["a"]})
        ),  # a free OR
        required(term(product("In", A100)), {}),  # an empty term
        {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "preference": term(product("In", A100))}
                ]
            }
        },  # preferred only
        required(
            term(product("NotIn", "nvidia-h100-80gb-hbm3"))
        ),  # NotIn compares exactly: no node is so labelled
    ],
)
def test_what_does_not_keep_a_pod_off_a_model_keeps_it_open(affinity: dict[str, Any]) -> None:
    assert models({"affinity": affinity}).open_to(H100)


def test_pod_labels_and_a_node_name_say_nothing_of_the_model() -> None:
    assert models({"nodeName": "node-1", "nodeSelector": {PRODUCT_LABEL: A100}}) == Placement()
    # Pod labels are not read at all: only the spec is given.
    assert models({}).open_to(H100)


# The hardware file of a cluster whose boards are those NVIDIA's table lists.
NVIDIA_BOARDS = gpu_models(mig_profile_models=NVIDIA_MIG_PROFILE_MODELS)


def test_a_mig_profile_pins_no_model_until_the_hardware_file_says_which_boards_have_it() -> None:
    """Boards outside NVIDIA's table share its profile names (a GH200's `1g.24gb` is an H100 NVL's too): by
    default a profile is any model, so a pod asking one is never believed unable to reach a board."""
    spec = {"containers": [{"name": "m", "resources": {"limits": {"nvidia.com/mig-1g.24gb": 1}}}]}
    assert models(spec) == Placement()
    assert not models(spec, catalogue=NVIDIA_BOARDS).open_to("NVIDIA-GH200-480GB")


def test_a_mig_profile_on_two_boards_can_land_on_either() -> None:
    spec = {"containers": [{"name": "m", "resources": {"limits": {"nvidia.com/mig-3g.40gb": 1}}}]}
    placement = models(spec, catalogue=NVIDIA_BOARDS)
    assert placement.open_to(H100) and placement.open_to(A100)
    assert not placement.open_to("NVIDIA-A30")
    one_board = models(
        {"containers": [{"name": "m", "resources": {"limits": {"nvidia.com/mig-1g.6gb.me": 1}}}]},
        catalogue=NVIDIA_BOARDS,
    )
    assert one_board.open_to("NVIDIA-A30") and not one_board.beyond(["NVIDIA-A30"])
    unknown = models(
        {"containers": [{"name": "m", "resources": {"limits": {"nvidia.com/mig-1g.99gb": 1}}}]},
        catalogue=NVIDIA_BOARDS,
    )
    assert unknown == Placement()


def test_node_pools_map_labels_to_models() -> None:
    hardware = parse_hardware(
        {"gpu_node_pools": {"cloud.example/pool": {"big": [H100], "small": [T4, "NVIDIA L4"]}}}
    )
    catalogue = hardware.models
    assert not models({"nodeSelector": {"cloud.example/pool": "big"}}, catalogue=catalogue).beyond([H100])
    small = models(
        {"affinity": required(term({"key": "cloud.example/pool", "operator": "In", "values": ["small"]}))},
        catalogue=catalogue,
    )
    assert small.open_to("NVIDIA-L4") and not small.open_to(H100)
    assert models({"nodeSelector": {"cloud.example/pool": "unmapped"}}, catalogue=catalogue) == Placement()
    notin = {"key": "cloud.example/pool", "operator": "NotIn", "values": ["big"]}
    assert models({"affinity": required(term(notin))}, catalogue=catalogue).open_to(H100)


def test_a_selector_pins_a_model_only_when_read_exactly() -> None:
    exact = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'"
    assert expression_models(exact, DEFAULT_GPU_MODELS) == {model_match_key(H100)}
    assert expression_models(exact + " || true", DEFAULT_GPU_MODELS) is None
    assert (
        expression_models("device.attributes['gpu.nvidia.com'].productName != 'X'", DEFAULT_GPU_MODELS)
        is None
    )
    assert expression_models("true", DEFAULT_GPU_MODELS) is None
    profile = "device.attributes['gpu.nvidia.com'].profile == '1g.6gb'"
    assert expression_models(profile, NVIDIA_BOARDS) == {model_match_key("NVIDIA-A30")}
    assert expression_models(profile, DEFAULT_GPU_MODELS) is None


def test_a_claim_pins_the_union_of_its_requests_and_none_if_one_is_free() -> None:
    def request(expression: str | None, device_class: str = "gpu.nvidia.com") -> dict[str, Any]:
        built: dict[str, Any] = {"name": "r", "deviceClassName": device_class}
        if expression:
            built["selectors"] = [{"cel": {"expression": expression}}]
        return {"exactly": built}

    h100 = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'"
    a100 = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA A100-SXM4-80GB'"
    spec = {"devices": {"requests": [request(h100), request(a100)]}}
    assert claim_models(spec, {}, DEFAULT_GPU_MODELS) == {model_match_key(H100), model_match_key(A100)}
    free = {"devices": {"requests": [request(h100), request(None)]}}
    assert claim_models(free, {}, DEFAULT_GPU_MODELS) is None
    by_class = {"h100s": frozenset({model_match_key(H100)})}
    assert (
        claim_models({"devices": {"requests": [request(None, "h100s")]}}, by_class, DEFAULT_GPU_MODELS)
        == by_class["h100s"]
    )
    placement = models({}, claim_models=[frozenset({model_match_key(A100)})])
    assert not placement.open_to(H100)
    assert models({}, claim_models=[frozenset({model_match_key(A100)}), None]).open_to(H100)


def test_the_hardware_file_refuses_a_malformed_model_key() -> None:
    with pytest.raises(ValueError, match="gpu_node_pools"):
        parse_hardware({"gpu_node_pools": {"pool": {"big": "NVIDIA-H100"}}})
    with pytest.raises(ValueError, match="mig_profile_models"):
        parse_hardware({"mig_profile_models": {"1g.10gb": []}})
    assert gpu_models(mig_profile_models={"1g.10gb": [T4]}).profile_models("1g.10gb") == {model_match_key(T4)}
