"""Kueue's kueue.x-k8s.io/v1beta1 Workload and WorkloadPriorityClass served from CRDs, for the cluster
layer's 1.20 API server. The schemas follow the upstream Go types (kubernetes-sigs/kueue,
apis/kueue/v1beta1/workload_types.go and workloadpriorityclass_types.go) for the spec fields, their
defaults and bounds; a pod set's template and the status (admission, conditions...) are kept whole
(Kueue's own controller writes the status, here the test). 1.20 has no CRD validation rules (CEL), so
the upstream `x-kubernetes-validations` — among them that priorityClassName and priorityClassSource are
immutable while quota is reserved, spec.priority never — are not enforced here."""

from __future__ import annotations

from typing import Any

GROUP = "kueue.x-k8s.io"
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
INT32 = {"type": "integer", "format": "int32"}
KEPT: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}

POD_SET = {
    "type": "object",
    "required": ["count", "template"],
    "properties": {
        "name": {
            "type": "string",
            "default": "main",
            "maxLength": 63,
            "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        },
        "template": KEPT,
        "count": {**INT32, "default": 1, "minimum": 0},
        "minCount": {**INT32, "minimum": 1},
        "topologyRequest": KEPT,
    },
}

WORKLOAD_SPEC = {
    "type": "object",
    "required": ["podSets"],
    "properties": {
        "podSets": {
            "type": "array",
            "minItems": 1,
            "maxItems": 8,
            "items": POD_SET,
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["name"],
        },
        "queueName": {"type": "string", "maxLength": 253, "pattern": NAME_PATTERN},
        "priorityClassName": {"type": "string", "maxLength": 253, "pattern": NAME_PATTERN},
        "priority": INT32,
        # Upstream defaults it to "": 1.20 reads an empty default as null and refuses the CRD.
        "priorityClassSource": {
            "type": "string",
            "enum": ["kueue.x-k8s.io/workloadpriorityclass", "scheduling.k8s.io/priorityclass", ""],
        },
        "active": {"type": "boolean", "default": True},
        "maximumExecutionTimeSeconds": {**INT32, "minimum": 1},
    },
}


def _crd(kind: str, plural: str, scope: str, schema: dict[str, Any], **version: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                **({"shortNames": ["wl"]} if kind == "Workload" else {}),
            },
            "scope": scope,
            "versions": [
                {
                    "name": "v1beta1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    **version,
                }
            ],
        },
    }


WORKLOAD = _crd(
    "Workload",
    "workloads",
    "Namespaced",
    {
        "type": "object",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": WORKLOAD_SPEC,
            "status": KEPT,
        },
    },
    subresources={"status": {}},
    additionalPrinterColumns=[
        {"name": "Queue", "type": "string", "jsonPath": ".spec.queueName"},
        {"name": "Reserved in", "type": "string", "jsonPath": ".status.admission.clusterQueue"},
        {
            "name": "Admitted",
            "type": "string",
            "jsonPath": ".status.conditions[?(@.type=='Admitted')].status",
        },
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ],
)

WORKLOAD_PRIORITY_CLASS = _crd(
    "WorkloadPriorityClass",
    "workloadpriorityclasses",
    "Cluster",
    {
        "type": "object",
        "required": ["value"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "value": INT32,
            "description": {"type": "string"},
        },
    },
    additionalPrinterColumns=[{"name": "Value", "type": "integer", "jsonPath": ".value"}],
)

CRDS = [WORKLOAD, WORKLOAD_PRIORITY_CLASS]


def workload_priority_class(name: str, value: int) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1beta1",
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": name},
        "value": value,
    }
