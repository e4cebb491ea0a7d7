"""Names the three deployables agree on: annotations, container, PriorityClasses, token audience."""

from typing import Final

DOMAIN: Final = "gpu-timekeeper.io"

# Annotations the webhook writes on every GPU pod and that users may not change.
ANNOTATION_PREFIX: Final = f"{DOMAIN}/"
ANNOTATION_GPU_SHARE: Final = f"{DOMAIN}/gpu-share"
ANNOTATION_SHARING_SYSTEM: Final = f"{DOMAIN}/sharing-system"
ANNOTATION_BUDGET_STATE: Final = f"{DOMAIN}/budget-state"
ANNOTATION_PRIORITY_DECISION: Final = f"{DOMAIN}/priority-decision"
ANNOTATION_INJECTED: Final = f"{DOMAIN}/injected"
ANNOTATION_WORKLOAD: Final = f"{DOMAIN}/workload"  # kind/name (gpuaccounting.workloads)
# On a pod of a workload (not a bare pod): the pods the workload declared and the time of its first admission,
# as the webhook recorded them (webhook.watches.workloads bounds the reuse of a workload's class by both).
ANNOTATION_WORKLOAD_SIZE: Final = f"{DOMAIN}/workload-size"
ANNOTATION_WORKLOAD_SINCE: Final = f"{DOMAIN}/workload-since"
# On every GPU pod: the user the API server said created it (the admission request's userInfo), which the
# tenant cannot forge as it can an ownerReference: only a workload controller's pods share a class.
ANNOTATION_CREATED_BY: Final = f"{DOMAIN}/created-by"
# On a GPU pod admitted while some of its namespace's GPU models had their own budget exhausted: those it
# could not land on (its spec, or our steering, kept it off them), comma-separated. A later pod of its
# workload that can land on one of them keeps no class from it (docs/webhook.md#model-budgets).
ANNOTATION_MODELS_OFF: Final = f"{DOMAIN}/models-off"
# On every GPU pod the webhook admits, so that it can watch them alone for their workloads' classes.
LABEL_GPU_POD: Final = f"{DOMAIN}/gpu-pod"

SIDECAR_CONTAINER_NAME: Final = "gpu-timekeeper-sidecar"
SIDECAR_TOKEN_VOLUME: Final = "gpu-timekeeper-token"
SIDECAR_BUFFER_VOLUME: Final = "gpu-timekeeper-buffer"
SIDECAR_PODINFO_VOLUME: Final = "gpu-timekeeper-podinfo"

TOKEN_AUDIENCE: Final = "gpu-timekeeper"

# Kubernetes object names: a namespace is a DNS label, a pod a DNS subdomain.
DNS_LABEL: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

DEFAULT_IN_BUDGET_PRIORITY_CLASS: Final = "gpu-in-budget"
DEFAULT_OVER_BUDGET_PRIORITY_CLASS: Final = "gpu-over-budget"

API_PREFIX: Final = "/api/v1"
REPORTS_PATH: Final = f"{API_PREFIX}/reports"
ADMISSION_STATE_PATH: Final = f"{API_PREFIX}/admission-state"
# The caller's bearer token, repeated for the timekeeper by a client that reaches it through the API
# server's service proxy (`kubectl gpu-budget`): the API server removes `Authorization` once it has
# authenticated a request, so the token would not arrive otherwise.
PROXIED_AUTHORIZATION_HEADER: Final = "X-Gpu-Timekeeper-Authorization"
# The member cluster a caller of a fleet's hub belongs to (docs/fleet.md): the hub has that member's API
# server review the caller's token, so naming another cluster only gets the token refused. Absent: the
# hub's own cluster, as in a single-cluster install.
CLUSTER_HEADER: Final = "X-Gpu-Timekeeper-Cluster"

# A pod's terminationGracePeriodSeconds when its spec names none (the API server's default).
DEFAULT_TERMINATION_GRACE_SECONDS: Final = 30
