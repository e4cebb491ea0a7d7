"""GPU model names, spelt one way: what billing weights, model budgets and the webhook's placement compare.
Pure, standard library only (the timekeeper and the webhook both import it)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

_SEPARATORS = re.compile(r"[\s_]+")
_DASHES = re.compile(r"-{2,}")


@lru_cache(maxsize=1024)  # a cluster has few GPU models, and every report names one (ingest's hot path)
def model_key(name: str) -> str:
    """One spelling per GPU model: NVML's device name ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB MIG
    1g.5gb") and GPU Feature Discovery's `nvidia.com/gpu.product` label ("NVIDIA-H100-80GB-HBM3",
    "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb") name the same GPU the same way once blanks become dashes."""
    return _DASHES.sub("-", _SEPARATORS.sub("-", name.strip())).strip("-")


@lru_cache(maxsize=4096)
def model_match_key(name: str) -> str:
    """What two model names are compared by: `model_key` without case, so a tenant's "nvidia-h100-80gb-hbm3"
    or "NVIDIA H100 80GB HBM3" is the budget's "NVIDIA-H100-80GB-HBM3". Every comparison of models uses it."""
    return model_key(name).casefold()


def same_model(a: str, b: str) -> bool:
    return model_match_key(a) == model_match_key(b)


def match_keys(names: Iterable[str]) -> frozenset[str]:
    """The names' match keys, as a set."""
    return frozenset(model_match_key(name) for name in names)


# The MIG GPU-instance profiles of NVIDIA's boards, by GPU Feature Discovery's `nvidia.com/gpu.product`
# spelling of each board (NVML's name, blanks as dashes): which models a pod asking `nvidia.com/mig-<profile>`
# (mixed strategy) can land on. Source: NVIDIA's Multi-Instance GPU User Guide, "Supported MIG Profiles"
# (https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html) and "Supported GPUs".
# Attributed profiles (`+me`, `.me.all`, `-me`, `+gfx`) and compute-instance profiles (`1c.2g.20gb`) are read
# as their GPU instance's profile: they exist only where it does. Not the default: boards this table does
# not list share its names (H800 and A800 the 80 GB ones; GH200 and H20 `1g.12gb`, `1g.24gb`, `2g.24gb`;
# RTX PRO 6000 Blackwell `1g.24gb`), and a pod asking such a profile would be believed unable to land on
# them. An admin copies the boards the cluster has into the hardware file's `mig_profile_models`.
_A100_40GB: Final = ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB")
_A100_H100_80GB: Final = (
    "NVIDIA-A100-SXM4-80GB",
    "NVIDIA-A100-80GB-PCIe",
    "NVIDIA-H100-80GB-HBM3",
    "NVIDIA-H100-PCIe",
)
_H100_94GB: Final = ("NVIDIA-H100-NVL",)
_H200: Final = ("NVIDIA-H200", "NVIDIA-H200-NVL")
_A30: Final = ("NVIDIA-A30",)
NVIDIA_MIG_PROFILE_MODELS: Final[dict[str, tuple[str, ...]]] = {
    **dict.fromkeys(("1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"), _A100_40GB),
    "1g.10gb": (*_A100_40GB, *_A100_H100_80GB),  # the 40 GB A100's double-memory 1g, the 80 GB boards' 1g
    **dict.fromkeys(("1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"), _A100_H100_80GB),
    **dict.fromkeys(("1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"), _H100_94GB),
    **dict.fromkeys(("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"), _H200),
    **dict.fromkeys(("1g.6gb", "2g.12gb", "4g.24gb"), _A30),
}
# A MIG profile's GPU instance: `[<c>c.]<g>g.<m>gb`, then any attributes (see gpuaccounting.shares).
_MIG_INSTANCE: Final = re.compile(r"^(?:[0-9]{1,2}c\.)?([0-9]{1,2}g\.[0-9]{1,4}gb)(?:[+.-].*)?$")
MIG_RESOURCE_PREFIX: Final = "nvidia.com/mig-"


def mig_instance_profile(profile: str) -> str | None:
    """The GPU instance profile a MIG profile or resource suffix names (`1c.2g.20gb`, `1g.10gb.me`: `2g.20gb`,
    `1g.10gb`); None for a name that is no profile."""
    found = _MIG_INSTANCE.match(profile)
    return found.group(1) if found else None


Models = frozenset[str]  # model match keys


@dataclass(frozen=True, slots=True)
class GpuModels:
    """Where the hardware file says which GPU models a node or device is: node pool labels an admin maps to
    models (`gpu_node_pools`), and the models each MIG profile exists on (`mig_profile_models`). Models are
    kept as match keys; hashable, as the rest of the hardware configuration is."""

    node_pools: tuple[tuple[str, tuple[tuple[str, Models], ...]], ...] = ()
    # None by default: a MIG profile pins no model until the hardware file says which boards the cluster has.
    mig_profiles: tuple[tuple[str, Models], ...] = ()

    def pool_models(self, key: str, value: str) -> Models | None:
        """The models of the pool a node label names; None: not a pool label, or a value not mapped."""
        for pool_key, values in self.node_pools:
            if pool_key == key:
                return next((models for named, models in values if named == value), None)
        return None

    def is_pool_label(self, key: str) -> bool:
        return any(pool_key == key for pool_key, _ in self.node_pools)

    def profile_models(self, profile: str) -> Models | None:
        """The models a MIG profile exists on; None for a profile the table does not list (any model)."""
        instance = mig_instance_profile(profile)
        return next((models for named, models in self.mig_profiles if named == instance), None)


DEFAULT_GPU_MODELS: Final = GpuModels()


def gpu_models(
    node_pools: Mapping[str, Mapping[str, Iterable[str]]] | None = None,
    mig_profile_models: Mapping[str, Iterable[str]] | None = None,
) -> GpuModels:
    """A `GpuModels` from the file's two keys; one not given keeps its default (no pools; no MIG profile
    pins a model)."""
    pools = tuple(
        sorted(
            (key, tuple(sorted((value, match_keys(models)) for value, models in values.items())))
            for key, values in (node_pools or {}).items()
        )
    )
    if mig_profile_models is None:
        return GpuModels(node_pools=pools)
    profiles = tuple(
        sorted((mig_instance_profile(p) or p, match_keys(models)) for p, models in mig_profile_models.items())
    )
    return GpuModels(node_pools=pools, mig_profiles=profiles)
