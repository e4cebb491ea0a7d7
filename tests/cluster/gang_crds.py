"""Gang schedulers' objects served from CRDs for the cluster layer's 1.20 API server, their schemas written
from the upstream Go types for the fields the webhook and the schedulers read: Volcano's PodGroup
(volcano.sh/apis pkg/apis/scheduling/v1beta1/types.go) and Kubeflow's PyTorchJob (kubeflow/training-operator
pkg/apis/kubeflow.org/v1: a top owner KAI-Scheduler's podgrouper knows), whose pod templates are kept
whole (the API server stores them; nothing here validates a pod)."""

from __future__ import annotations

from typing import Any

from tests.cluster.dra_crds import ANY, QUANTITIES


def _crd(group: str, kind: str, plural: str, version: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
            "scope": "Namespaced",
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


def _object(spec: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {"type": "object", "properties": spec},
            "status": {"type": "object", "properties": status},
        },
    }


VOLCANO_PODGROUP = _crd(
    "scheduling.volcano.sh",
    "PodGroup",
    "podgroups",
    "v1beta1",
    _object(
        {
            "minMember": {"type": "integer", "format": "int32"},
            "minTaskMember": {
                "type": "object",
                "additionalProperties": {"type": "integer", "format": "int32"},
            },
            "queue": {"type": "string"},
            "priorityClassName": {"type": "string"},
            "minResources": QUANTITIES,
            "networkTopology": {
                "type": "object",
                "properties": {
                    "mode": {"type": "string", "enum": ["hard", "soft"]},
                    "highestTierAllowed": {"type": "integer"},
                },
            },
        },
        {
            "phase": {"type": "string"},
            "conditions": {"type": "array", "items": ANY},
            "running": {"type": "integer", "format": "int32"},
            "succeeded": {"type": "integer", "format": "int32"},
            "failed": {"type": "integer", "format": "int32"},
        },
    ),
)

REPLICA_SPEC = {
    "type": "object",
    "properties": {
        "replicas": {"type": "integer", "format": "int32"},
        "template": ANY,  # a core/v1 PodTemplateSpec
        "restartPolicy": {"type": "string"},
    },
}
PYTORCH_JOB = _crd(
    "kubeflow.org",
    "PyTorchJob",
    "pytorchjobs",
    "v1",
    _object(
        {
            "pytorchReplicaSpecs": {"type": "object", "additionalProperties": REPLICA_SPEC},
            "runPolicy": ANY,
            "elasticPolicy": ANY,
            "nprocPerNode": {"type": "string"},
        },
        {"conditions": {"type": "array", "items": ANY}, "replicaStatuses": ANY},
    ),
)

CRDS = (VOLCANO_PODGROUP, PYTORCH_JOB)
