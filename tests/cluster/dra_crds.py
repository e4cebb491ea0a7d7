"""resource.k8s.io/v1 (Kubernetes 1.34's Dynamic Resource Allocation) served from CRDs, for the cluster
layer's 1.20 API server, which has no such group. The schemas follow the upstream Go types
(k8s.io/api/resource/v1/types.go) for every field the webhook reads: DeviceClass, ResourceClaimTemplate,
ResourceClaim (with the status the scheduler and a driver write) and ResourceSlice. A *.k8s.io group is
protected, hence the api-approved annotation."""

from __future__ import annotations

from typing import Any

APPROVED = "https://github.com/kubernetes/enhancements/pull/4381"  # KEP-4381, DRA structured parameters
ANY: dict[str, Any] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
QUANTITIES = {
    "type": "object",
    "additionalProperties": {
        "x-kubernetes-int-or-string": True,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
    },
}
STRINGS = {"type": "array", "items": {"type": "string"}}
SELECTORS = {
    "type": "array",
    "maxItems": 32,
    "items": {
        "type": "object",
        "properties": {
            "cel": {
                "type": "object",
                "required": ["expression"],
                "properties": {"expression": {"type": "string", "maxLength": 10240}},
            }
        },
    },
}
OPAQUE = {
    "type": "object",
    "required": ["driver", "parameters"],
    "properties": {"driver": {"type": "string", "maxLength": 63}, "parameters": ANY},
}
CAPACITY = {"type": "object", "properties": {"requests": QUANTITIES}}
MODE = {"type": "string", "enum": ["ExactCount", "All"]}
COUNT = {"type": "integer", "format": "int64", "minimum": 1}
TOLERATIONS = {"type": "array", "items": ANY}
EXACT = {
    "type": "object",
    "required": ["deviceClassName"],
    "properties": {
        "deviceClassName": {"type": "string", "maxLength": 253},
        "selectors": SELECTORS,
        "allocationMode": MODE,
        "count": COUNT,
        "adminAccess": {"type": "boolean"},
        "tolerations": TOLERATIONS,
        "capacity": CAPACITY,
    },
}
SUBREQUEST = {
    "type": "object",
    "required": ["name", "deviceClassName"],
    "properties": {
        "name": {"type": "string", "maxLength": 63},
        **{key: value for key, value in EXACT["properties"].items() if key != "adminAccess"},
    },
}
CLAIM_SPEC = {
    "type": "object",
    "properties": {
        "devices": {
            "type": "object",
            "properties": {
                "requests": {
                    "type": "array",
                    "maxItems": 32,
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {
                            "name": {"type": "string", "maxLength": 63},
                            "exactly": EXACT,
                            "firstAvailable": {"type": "array", "maxItems": 8, "items": SUBREQUEST},
                        },
                    },
                },
                "constraints": {
                    "type": "array",
                    "maxItems": 32,
                    "items": {
                        "type": "object",
                        "properties": {
                            "requests": STRINGS,
                            "matchAttribute": {"type": "string"},
                            "distinctAttribute": {"type": "string"},
                        },
                    },
                },
                "config": {
                    "type": "array",
                    "maxItems": 32,
                    "items": {"type": "object", "properties": {"requests": STRINGS, "opaque": OPAQUE}},
                },
            },
        }
    },
}
CLAIM_STATUS = {
    "type": "object",
    "properties": {
        "allocation": {
            "type": "object",
            "properties": {
                "devices": {
                    "type": "object",
                    "properties": {
                        "results": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["request", "driver", "pool", "device"],
                                "properties": {
                                    **{
                                        key: {"type": "string"}
                                        for key in ("request", "driver", "pool", "device", "shareID")
                                    },
                                    "adminAccess": {"type": "boolean"},
                                    "consumedCapacity": QUANTITIES,
                                },
                            },
                        },
                        "config": {"type": "array", "items": ANY},
                    },
                },
                "nodeSelector": ANY,
                "allocationTimestamp": {"type": "string", "format": "date-time"},
            },
        },
        "reservedFor": {
            "type": "array",
            "maxItems": 256,
            "items": {
                "type": "object",
                "required": ["resource", "name", "uid"],
                "properties": {key: {"type": "string"} for key in ("apiGroup", "resource", "name", "uid")},
            },
        },
        "devices": {"type": "array", "items": ANY},
    },
}
SPECS: dict[str, dict[str, Any]] = {
    "DeviceClass": {
        "type": "object",
        "properties": {
            "selectors": SELECTORS,
            "config": {
                "type": "array",
                "maxItems": 32,
                "items": {"type": "object", "properties": {"opaque": OPAQUE}},
            },
            "extendedResourceName": {"type": "string"},
        },
    },
    "ResourceClaimTemplate": {
        "type": "object",
        "required": ["spec"],
        "properties": {"metadata": ANY, "spec": CLAIM_SPEC},
    },
    "ResourceClaim": CLAIM_SPEC,
    "ResourceSlice": {
        "type": "object",
        "required": ["driver", "pool"],
        "properties": {
            "driver": {"type": "string", "maxLength": 63},
            "pool": {
                "type": "object",
                "required": ["name", "generation", "resourceSliceCount"],
                "properties": {
                    "name": {"type": "string"},
                    "generation": {"type": "integer", "format": "int64"},
                    "resourceSliceCount": {"type": "integer", "format": "int64"},
                },
            },
            "nodeName": {"type": "string"},
            "nodeSelector": ANY,
            "allNodes": {"type": "boolean"},
            "devices": {
                "type": "array",
                "maxItems": 128,
                "items": {
                    "type": "object",
                    "required": ["name"],
                    "properties": {
                        "name": {"type": "string"},
                        "attributes": ANY,
                        "capacity": ANY,
                        "allowMultipleAllocations": {"type": "boolean"},
                    },
                },
            },
        },
    },
}
NAMESPACED = {"ResourceClaimTemplate", "ResourceClaim"}


def crd(kind: str) -> dict[str, Any]:
    plural = kind.lower() + ("es" if kind.endswith("s") else "s")
    properties: dict[str, Any] = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": SPECS[kind],
    }
    version: dict[str, Any] = {"name": "v1", "served": True, "storage": True}
    if kind == "ResourceClaim":
        properties["status"] = CLAIM_STATUS
        version["subresources"] = {"status": {}}
    version["schema"] = {
        "openAPIV3Schema": {"type": "object", "required": ["spec"], "properties": properties}
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.resource.k8s.io",
            "annotations": {"api-approved.kubernetes.io": APPROVED},
        },
        "spec": {
            "group": "resource.k8s.io",
            "scope": "Namespaced" if kind in NAMESPACED else "Cluster",
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "listKind": f"{kind}List"},
            "versions": [version],
        },
    }


CRDS = [crd(kind) for kind in SPECS]
