"""The webhook's settings: one typed class read from `WEBHOOK_*` variables, through a cached getter."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from gpuaccounting import names
from gpuaccounting.admission_state import DEFAULT_EXEMPT_NAMESPACES
from gpuaccounting.hardware import load_hardware
from gpuaccounting.logs import LogFormat
from gpuaccounting.shares import GpuHardware, Rule

PreemptionPolicy = Literal["PreemptLowerPriority", "Never"]

ALL_RULES = frozenset(rule.value for rule in Rule)


class WebhookSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="WEBHOOK_", extra="ignore")

    host: str = "0.0.0.0"
    port: int = 8443
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_reload_interval_seconds: float = Field(default=60.0, gt=0)  # how often to look for a rotated cert
    log_format: LogFormat = "auto"  # JSON unless stderr is a terminal

    # What one client may cost (docs/webhook.md, "Limits"): the API server sends small reviews at once.
    max_body_bytes: int = Field(default=1024 * 1024, gt=0)  # a real pod's review is 2-20 KB
    max_header_bytes: int = Field(default=16 * 1024, gt=0)
    # To receive a request head (a new connection's TLS handshake included): the API server sends at once.
    head_timeout_seconds: float = Field(default=3.0, gt=0)
    body_timeout_seconds: float = Field(default=10.0, gt=0)  # to receive a body after its head
    keep_alive_timeout_seconds: int = Field(default=30, gt=0)  # an idle connection between requests
    max_connections: int = Field(default=100, gt=0)
    max_connections_per_source: int = Field(
        default=50, gt=0
    )  # from one address: the rest stay the API server's
    max_containers: int = Field(default=100, gt=0)  # init, app and ephemeral, in a pod being created

    # Budget state, polled from the timekeeper in the background.
    timekeeper_url: str = "http://gpu-timekeeper.gpu-timekeeper.svc:8080"
    timekeeper_token_file: Path | None = None  # re-read on every poll: projected tokens rotate
    state_poll_interval_seconds: float = Field(default=10.0, gt=0)
    state_poll_timeout_seconds: float = Field(default=5.0, gt=0)
    # After a failed poll: the one backoff (full jitter) from 1 s up to this, so replicas spread out.
    state_poll_retry_max_seconds: float = Field(default=60.0, gt=0)
    state_max_age_seconds: float = Field(default=120.0, gt=0)
    # A stale state decides with what it last knew; a state never loaded assumes this.
    missing_state_policy: Literal["in_budget", "over_budget"] = "in_budget"
    # In a fleet (docs/fleet.md): this cluster's name as the hub knows it. Sent with every poll, so the
    # hub reviews our token with this cluster's API server and answers this cluster's namespaces; injected
    # into every sidecar, so its reports are charged here. Unset (or empty): the hub's own (or the only)
    # cluster.
    cluster: str | None = None

    # Priority. The numbers are the PriorityClass objects' own once the watch has listed them; these
    # are the fallback before the first list, or with the watch off.
    in_budget_priority_class: str = names.DEFAULT_IN_BUDGET_PRIORITY_CLASS
    in_budget_priority: int = 1000
    in_budget_preemption_policy: PreemptionPolicy = "PreemptLowerPriority"
    over_budget_priority_class: str = names.DEFAULT_OVER_BUDGET_PRIORITY_CLASS
    over_budget_priority: int = 100
    over_budget_preemption_policy: PreemptionPolicy = "Never"
    # Where a priority policy's exempt classes are exempt (JSON: class -> namespaces, "*" for any class);
    # elsewhere they are governed like a user's class. The timekeeper's reconciler reads the same setting.
    exempt_namespaces: dict[str, frozenset[str]] = Field(
        default_factory=lambda: dict(DEFAULT_EXEMPT_NAMESPACES)
    )

    # The cluster's PriorityClasses, listed and watched through the Kubernetes API (off: clusters and
    # tests without an API server; then only a pod without a class counts as "no class chosen").
    watch_priority_classes: bool = True
    kubeconfig: Path | None = None  # unset: the pod's ServiceAccount in a cluster, else the default file
    kube_request_timeout_seconds: float = Field(default=10.0, gt=0)
    kube_watch_timeout_seconds: int = Field(default=300, gt=0)  # each watch ends after this; then re-list
    kube_retry_max_seconds: float = Field(default=30.0, gt=0)  # the backoff's cap after failed lists/watches
    # DRA: ResourceClaimTemplates, ResourceClaims and DeviceClasses, listed and watched (off: no API server;
    # then a pod naming a claim is denied, its GPUs unknown). Unset: as watch_priority_classes (both need
    # the API server, and one switch turns both off where there is none).
    watch_resource_claims: bool | None = None
    dra_discovery_interval_seconds: float = Field(default=60.0, gt=0)  # look again for resource.k8s.io
    dra_fetch_timeout_seconds: float = Field(default=1.0, gt=0)  # a claim the watch has not brought yet
    # The GPU pods the webhook admitted (by our label), listed and watched so that a workload's later pods
    # get its first pods' class (docs/webhook.md, "One class per workload"). The grouping is the tenant's
    # to write, so the reuse is bounded: by the pods the workload declared in the object the API server
    # keeps (a Job's completions, else parallelism...), read when its first pod is admitted and capped here;
    # by this many pods where no such object is read; and in time from its first admission.
    watch_workload_pods: bool = True
    workload_class_max_pods: int = Field(default=1024, gt=0)
    workload_class_undeclared_pods: int = Field(default=8, gt=0)
    workload_class_max_age_seconds: float = Field(default=3600.0, gt=0)
    workload_fetch_timeout_seconds: float = Field(default=1.0, gt=0)  # to read the declared size

    # Injection.
    sidecar_mode: Literal["native", "container"] = "native"  # "container" for clusters before 1.29
    sidecar_image: str = "ghcr.io/gpu-timekeeper/sidecar:0.1.0"
    sidecar_image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    sidecar_timekeeper_url: str | None = None  # defaults to timekeeper_url
    sidecar_report_interval_seconds: int = Field(default=30, gt=0)
    sidecar_cpu_request: str = "10m"
    sidecar_memory_request: str = "32Mi"
    sidecar_memory_limit: str = "64Mi"
    sidecar_token_expiration_seconds: int = Field(default=3600, ge=600)
    sidecar_token_dir: str = "/var/run/secrets/gpu-timekeeper"
    sidecar_buffer_dir: str = "/var/lib/gpu-timekeeper/buffer"
    sidecar_buffer_size_limit: str = "64Mi"
    sidecar_podinfo_dir: str = "/etc/gpu-timekeeper/podinfo"

    # The hardware sizes the shares depend on: the JSON file the timekeeper reads too
    # (gpuaccounting.hardware); unset: the defaults.
    hardware_file: Path | None = None

    # Governance: every rule is enforced unless listed here (comma-separated).
    disabled_rules: Annotated[frozenset[str], NoDecode] = frozenset()
    # Users (e.g. the timekeeper's ServiceAccount) allowed to change our annotations on running pods.
    privileged_usernames: Annotated[frozenset[str], NoDecode] = frozenset()
    # The users whose pods may share their workload's class (docs/webhook.md, "The bounds of reuse"): the
    # controllers that create a workload's pods, never its tenant. An entry ending in ":" is a prefix (all
    # ServiceAccounts of a namespace no tenant may create pods in); add Volcano's, Kubeflow's... here.
    workload_controllers: Annotated[frozenset[str], NoDecode] = frozenset(
        {"system:kube-controller-manager", "system:serviceaccount:kube-system:"}
    )

    # A GPU pod admitted at the reduced class frees its GPU within this many seconds of its preemption:
    # /mutate caps its terminationGracePeriodSeconds, /validate refuses more (docs/webhook.md).
    over_budget_max_grace_seconds: int = Field(default=30, ge=0)

    @field_validator("log_format", mode="before")
    @classmethod
    def _console_is_text(cls, value: object) -> object:
        """`console`, this setting's name for text lines before the deployables shared one logger."""
        return "text" if value == "console" else value

    @field_validator("disabled_rules", "privileged_usernames", "workload_controllers", mode="before")
    @classmethod
    def _split_names(cls, value: object) -> object:
        if isinstance(value, str):
            return frozenset(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("disabled_rules")
    @classmethod
    def _known_rules(cls, value: frozenset[str]) -> frozenset[str]:
        unknown = value - ALL_RULES
        if unknown:
            raise ValueError(f"unknown rules {sorted(unknown)}; known: {sorted(ALL_RULES)}")
        if Rule.MINIMUM_SHARE in value:
            raise ValueError(
                f"{Rule.MINIMUM_SHARE} is never disabled (a share below it would be written as 0);"
                " lower the floor in the hardware file's minimum_shares instead"
            )
        return value

    @field_validator("cluster")
    @classmethod
    def _cluster_is_a_name(cls, value: str | None) -> str | None:
        """The hub's member names are DNS labels (timekeeper.settings.ClusterName): another would only
        have every poll refused."""
        if not value:
            return None
        if len(value) > 63 or not re.match(names.DNS_LABEL, value):
            raise ValueError(f"{value!r} is not a member cluster's name (a DNS label, e.g. eu-train)")
        return value

    @field_validator("hardware_file")
    @classmethod
    def _hardware_is_usable(cls, value: Path | None) -> Path | None:
        """A broken hardware file stops the webhook at start, not an admission."""
        load_hardware(value)
        return value

    @property
    def hardware(self) -> GpuHardware:
        """Read from the file on each call; the admission logic reads it once, at start."""
        return load_hardware(self.hardware_file)

    @property
    def watches_resource_claims(self) -> bool:
        return (
            self.watch_priority_classes if self.watch_resource_claims is None else self.watch_resource_claims
        )

    @property
    def watches_workload_pods(self) -> bool:
        return self.watch_priority_classes and self.watch_workload_pods

    def enforces(self, rule: str) -> bool:
        return rule not in self.disabled_rules

    def is_workload_controller(self, username: str) -> bool:
        """Whether `username` is one of `workload_controllers`, or under a prefix of them."""
        return any(
            username == entry or (entry.endswith(":") and username.startswith(entry))
            for entry in self.workload_controllers
        )


@lru_cache
def get_settings() -> WebhookSettings:
    """The process's settings; tests build their own WebhookSettings and pass it to create_app."""
    return WebhookSettings()
