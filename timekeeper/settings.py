"""The timekeeper's settings: one pydantic-settings class read from `TIMEKEEPER_*` environment variables."""

from __future__ import annotations

from datetime import timedelta
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, AwareDatetime, BaseModel, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from gpuaccounting.admission_state import DEFAULT_EXEMPT_NAMESPACES
from gpuaccounting.clock import WallClock, build_clock
from gpuaccounting.hardware import load_hardware
from gpuaccounting.names import (
    DEFAULT_IN_BUDGET_PRIORITY_CLASS,
    DEFAULT_OVER_BUDGET_PRIORITY_CLASS,
    DNS_LABEL,
)
from gpuaccounting.shares import GpuHardware

NamespaceName = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL)]
ClusterName = Annotated[str, Field(min_length=1, max_length=63, pattern=DNS_LABEL)]
TokenDigests = Annotated[tuple[str, ...], NoDecode]


class Member(BaseModel):
    """A member cluster of a fleet (docs/fleet.md): its API server, through a kubeconfig the admin mounts
    from a Secret, whose credentials may review tokens and access, and watch and read what the reconciler
    reads there (deployment/member/ holds the RBAC)."""

    kubeconfig: Path
    context: str | None = None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TIMEKEEPER_", extra="ignore")

    database_url: str | None = Field(
        default=None,
        description="PostgreSQL URL; when unset an embedded PostgreSQL is started in data_dir.",
    )
    data_dir: Path = Field(default=Path(".timekeeper-data"), description="Embedded PostgreSQL's data folder.")
    database_pool_size: int = Field(default=10, ge=1)

    auth_mode: Literal["static", "kubernetes"] = "static"
    admin_token_sha256: TokenDigests = ()
    reporter_token_sha256: TokenDigests = ()
    reader_token_sha256: TokenDigests = ()
    reader_tokens: dict[str, tuple[NamespaceName, ...]] = Field(
        default_factory=dict,
        description='Static mode: reader tokens scoped to namespaces, JSON {"<sha256>": ["team-a", ...]}.',
    )
    reporter_tokens: dict[str, tuple[NamespaceName, ...]] = Field(
        default_factory=dict,
        description='Static mode: reporter tokens scoped to namespaces, JSON {"<sha256>": ["team-a", ...]}.',
    )
    anonymous_read: bool = False
    read_scope_concurrency: int = Field(
        default=16,
        ge=1,
        le=256,
        description="Listing for a caller who may read only some namespaces: at most this many "
        "authorization questions (Kubernetes: SubjectAccessReviews) in flight, one per known namespace.",
    )
    metrics_auth: Literal["open", "token"] = Field(
        default="open",
        description="token: /metrics needs a metrics token or a credential that may read every namespace.",
    )
    metrics_token_sha256: TokenDigests = ()
    ui_enabled: bool = Field(
        default=True, description="Serve the web dashboard under /ui (static files; it calls this API)."
    )

    in_budget_priority_class: str = DEFAULT_IN_BUDGET_PRIORITY_CLASS
    over_budget_priority_class: str = DEFAULT_OVER_BUDGET_PRIORITY_CLASS

    clock_skew: timedelta = Field(
        default=timedelta(seconds=60), description="How far in the future a report may end."
    )
    max_report_interval: timedelta = Field(
        default=timedelta(hours=1), description="Longest accepted interval."
    )
    max_report_age: timedelta = Field(
        default=timedelta(days=31),
        description="Oldest accepted interval start: time a sidecar buffered through an outage still lands "
        "in the previous period; anything older is refused.",
    )
    max_gpu_share: float = Field(default=256.0, gt=0, description="Largest believable GPU share of one pod.")
    billing_currency: str = Field(
        default="USD",
        min_length=1,
        max_length=16,
        description="The currency of the prices per GPU-hour (GET/PUT /billing/prices) and the chargeback.",
    )
    chargeback_exports: int = Field(
        default=1,
        ge=1,
        description="Chargeback exports one timekeeper process streams at once, each on a database "
        "connection of its own (a pool of this many, apart from the requests' pool).",
    )
    chargeback_export_wait_seconds: float = Field(
        default=10.0,
        ge=0,
        description="How long one more export waits for its turn; then it is answered 429 with Retry-After.",
    )
    chargeback_export_timeout_seconds: float = Field(
        default=300.0,
        gt=0,
        description="statement_timeout of an export's statement; one that runs longer is answered 503.",
    )
    max_body_bytes: int = Field(default=64 * 1024, ge=1024, description="Largest accepted request body.")
    # What one client may cost the server (docs/security.md, "Hostile clients"), per worker process.
    max_head_bytes: int = Field(default=32 * 1024, ge=1024, description="Larger request heads answer 431.")
    head_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="To receive a request head, from the connection's start or its first byte.",
    )
    body_timeout_seconds: float = Field(default=30.0, gt=0, description="To receive a body after its head.")
    max_connections: int = Field(default=1000, ge=1, description="Open connections; one more is dropped.")
    max_connections_per_source: int = Field(
        default=200, ge=1, description="Open connections from one client address; one more is dropped."
    )

    log_format: Literal["auto", "json", "text"] = Field(
        default="auto", description="Log lines as JSON or text; auto is JSON unless stderr is a terminal."
    )
    log_level: str = "INFO"

    # Kubernetes: the cluster connection (auth mode `kubernetes`, the reconciler); docs/kubernetes.md.
    kube_in_cluster: bool | None = Field(
        default=None, description="Use the pod's ServiceAccount; unset: when KUBERNETES_SERVICE_HOST is set."
    )
    kubeconfig: Path | None = Field(default=None, description="Kubeconfig file; unset: the default one.")
    kube_context: str | None = None
    kube_request_timeout_seconds: float = Field(default=10.0, gt=0)
    # What one API server's answers may hold, each of the hub's and its members' (docs/kubernetes.md).
    # At least 4 MiB: above one object's largest (etcd's 1.5 MiB) and a page of them halved to one.
    kube_max_response_bytes: int = Field(default=64 * 2**20, ge=4 * 2**20, description="One answer's body.")
    kube_max_list_items: int = Field(default=200_000, ge=1, description="Items of a member's paged list.")
    kube_max_list_pages: int = Field(default=2_000, ge=1, description="Requests of a member's paged list.")
    # A fleet: the member clusters this timekeeper serves beside its own (docs/fleet.md).
    members: dict[ClusterName, Member] = Field(
        default_factory=dict,
        description="Member clusters by name, each with its kubeconfig (JSON); Kubernetes auth mode only.",
    )
    # A member's API server is slow at will: the reviews waiting on it hold hub connections (docs/fleet.md).
    member_reviews_in_flight: int = Field(
        default=16, ge=1, description="Token and access reviews waiting on one member; more get a 503."
    )
    member_review_timeout_seconds: float = Field(
        default=5.0, gt=0, description="How long a member's review may take; then a 503."
    )
    reconcile: bool = Field(
        default=False,
        description="Watch pods: charge silent pods, close out ended ones, downgrade, apply quotas.",
    )
    reconcile_interval_seconds: float = Field(default=60.0, gt=0)
    gitops: bool = Field(
        default=False,
        description="Sync GPUBudget/GPUBudgetDefault objects (their CRDs installed) with the budgets, on "
        "the scheduler's leader (docs/gitops.md).",
    )
    gitops_interval_seconds: float = Field(
        default=10.0, gt=0, description="How often the leader syncs GPUBudget objects and their status."
    )
    gitops_status_interval_seconds: float = Field(
        default=60.0,
        ge=0,
        description="A GPUBudget status whose only change is its figures is written at most this often.",
    )
    silent_grace_seconds: float = Field(
        default=300.0,
        ge=0,
        description="How long a running pod's sidecar may be silent before the time is charged.",
    )
    sidecar_silent_after_seconds: float = Field(
        default=300.0,
        gt=0,
        description="A running GPU pod whose sidecar sent no report for this long counts in "
        "timekeeper_silent_gpu_pods (the GPUTimekeeperSidecarSilent alert).",
    )
    evictions_per_pass: int = Field(
        default=10, ge=1, description="At most this many evictions per reconcile pass; the rest wait."
    )
    evict_bare_pods: bool = Field(default=False, description="Also evict pods without a controller.")
    kueue_over_budget_priority_class: str = Field(
        default=DEFAULT_OVER_BUDGET_PRIORITY_CLASS,
        description="The WorkloadPriorityClass whose value the Kueue Workloads of an exhausted namespace "
        "whose running_pod_action is kueue are lowered to (docs/kubernetes.md).",
    )
    kueue_in_budget_priority_class: str = Field(
        default=DEFAULT_IN_BUDGET_PRIORITY_CLASS,
        description="The WorkloadPriorityClass whose value bounds a lowered Workload's restored priority "
        "(unless the namespace's priority policy sets a ceiling).",
    )
    exempt_namespaces: dict[str, frozenset[NamespaceName]] = Field(
        default_factory=lambda: dict(DEFAULT_EXEMPT_NAMESPACES),
        description="Where a priority policy's exempt classes are exempt, JSON "
        '{"<class>": [namespaces]} ("*": any class not named); elsewhere they are evicted like any class. '
        "The webhook's setting too.",
    )
    hardware_file: Path | None = Field(
        default=None,
        description="The JSON hardware sizes the webhook reads too (GPU memory, MIG slices, time-slicing "
        "replicas, ...), for recomputed shares and ResourceQuotas; unset: the defaults.",
    )

    clock_start: AwareDatetime | None = Field(
        default=None, description="Demo clock: the simulated time it reads at clock_origin."
    )
    clock_speed: float = Field(
        default=1.0, gt=0, allow_inf_nan=False, description="Demo clock: simulated seconds per real second."
    )
    clock_origin: float | None = Field(
        default=None,
        allow_inf_nan=False,
        description="Demo clock: the real Unix time (seconds) at which it reads clock_start; the sidecars "
        "of the simulated cluster are given the same three values.",
    )

    scheduler_enabled: bool = Field(
        default=True, description="Compete for the scheduler's leadership inside the API process."
    )
    scheduler_lock_key: int = Field(
        default=0x67746B5F73636864, description="The PostgreSQL advisory lock key the leader holds."
    )
    leader_retry_interval: timedelta = Field(
        default=timedelta(seconds=2),
        description="How often a follower tries to take the lock and the leader checks its connection.",
    )
    leader_check_timeout: timedelta | None = Field(
        default=None,
        description="How long a leader's connection check or a follower's lock attempt may take before it "
        "counts as failed (the leader then steps down); unset: two retry intervals.",
    )
    rollover_interval: timedelta = Field(default=timedelta(seconds=60), description="Roll-over job period.")
    states_interval: timedelta = Field(default=timedelta(seconds=60), description="State sweep period.")
    closeout_interval: timedelta = Field(default=timedelta(seconds=60), description="Close-out job period.")
    rollup_interval: timedelta = Field(default=timedelta(minutes=10), description="Roll-up job period.")
    report_interval: timedelta = Field(
        default=timedelta(seconds=30), description="How often sidecars report (the close-out's unit)."
    )
    closeout_after_intervals: int = Field(
        default=4, ge=1, description="A pod silent for this many report intervals is closed out."
    )
    ledger_retention: timedelta = Field(
        default=timedelta(hours=1),
        ge=timedelta(0),
        # TIMEKEEPER_ROLLUP_RETENTION, its name before the history was aggregated at ingest, meant the same:
        # how long raw rows are kept.
        validation_alias=AliasChoices(
            "ledger_retention", "TIMEKEEPER_LEDGER_RETENTION", "TIMEKEEPER_ROLLUP_RETENTION"
        ),
        description="How long a report's raw ledger row is kept (by its interval_end): for audit and "
        "debugging (each report's own figures and GPU entries) and to answer a retried report as a "
        "duplicate. Charges and history never need it (coverage and the hourly aggregates, written with "
        "it, do); 0 writes none. The roll-up job deletes older rows hour by hour, a whole day by DROP.",
    )
    hourly_history: timedelta = Field(
        default=timedelta(days=2),
        ge=timedelta(0),
        description="How long the history keeps a pod's hours (usage_pod_hours) before the roll-up job folds "
        "them into its day (usage_pod_days), hour by hour: what keeps utilisation, memory, power and report "
        "counts at hour resolution for recent windows (older days answer them per day, spread evenly over a "
        "window that cuts a day). Charges are exact either way: the charged time itself is kept to the "
        "second, so GPU-minutes, raw and weighted, and costs never change with the fold.",
    )
    partitions_interval: timedelta = Field(
        default=timedelta(minutes=10),
        description="Ledger partition upkeep job period (a no-op while the days ahead exist).",
    )
    ledger_partitions_ahead: int = Field(
        default=3,
        ge=1,
        le=60,
        description="The ledger's day partitions are kept created this many days ahead of today (UTC).",
    )
    forecast_window_minutes: int = Field(
        default=360,
        ge=1,
        le=60 * 24 * 31,
        description="The forecast's burn rate is the GPU-minutes charged over this many recent minutes.",
    )

    idle_after: timedelta = Field(
        default=timedelta(hours=1),
        gt=timedelta(0),
        description="Idle report: a running pod that has held its GPUs at least this long, and whose mean "
        "SM utilisation over this last stretch is below idle_below_sm_util_pct, is idle.",
    )
    idle_below_sm_util_pct: float = Field(
        default=5.0,
        ge=0,
        le=100,
        allow_inf_nan=False,
        description="Idle report: the utilisation threshold (%).",
    )
    trust_reported_utilisation: bool = Field(
        default=False,
        description="Kubernetes auth mode: let a report's SM utilisation lower its charge under the "
        "measured charge basis. A report carries a pod's token, which a tenant may hold: off, a report "
        "is charged by allocation whatever its figures (docs/billing.md, 'What a report cannot lower').",
    )
    # Downgrades a tenant cannot stall (docs/timekeeper.md, "Bounded downgrades").
    downgrade_pdb_patience_seconds: float = Field(
        default=600.0,
        ge=0,
        description="How long a PodDisruptionBudget may refuse a workload's downgrade eviction; after it "
        "the workload's pods are deleted (a DELETE no PodDisruptionBudget can refuse).",
    )
    over_budget_max_grace_seconds: int = Field(
        default=30,
        ge=0,
        description="The longest grace a downgraded pod is given (its eviction or deletion passes it when "
        "the pod's own terminationGracePeriodSeconds is longer); the webhook's "
        "WEBHOOK_OVER_BUDGET_MAX_GRACE_SECONDS caps a reduced pod's at admission.",
    )

    @field_validator(
        "admin_token_sha256",
        "reporter_token_sha256",
        "reader_token_sha256",
        "metrics_token_sha256",
        mode="before",
    )
    @classmethod
    def _split_digests(cls, value: object) -> object:
        """Comma-separated hex digests; a malformed one fails at start rather than never matching."""
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list | tuple):
            return tuple(_digest(str(part)) for part in value)
        return value

    @field_validator("reader_tokens", "reporter_tokens")
    @classmethod
    def _scoped_tokens(cls, value: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
        """Each digest well formed and given at least one namespace (a token scoped to nothing is a typo)."""
        scoped = {_digest(digest): tuple(sorted(set(namespaces))) for digest, namespaces in value.items()}
        if any(not namespaces for namespaces in scoped.values()):
            raise ValueError("a scoped token needs at least one namespace")
        return scoped

    @model_validator(mode="after")
    def _one_role_per_token(self) -> Settings:
        """A digest configured twice would hold whichever role was looked up first: refused at start."""
        digests = [
            *self.admin_token_sha256,
            *self.reporter_token_sha256,
            *self.reader_token_sha256,
            *self.reader_tokens,
            *self.reporter_tokens,
        ]
        if len(digests) != len(set(digests)):
            raise ValueError("a token digest is configured for more than one role")
        return self

    @field_validator(
        "clock_skew",
        "max_report_interval",
        "max_report_age",
        "leader_retry_interval",
        "leader_check_timeout",
        "rollover_interval",
        "states_interval",
        "closeout_interval",
        "rollup_interval",
        "partitions_interval",
        "report_interval",
        "ledger_retention",
        "idle_after",
        mode="before",
    )
    @classmethod
    def _seconds(cls, value: object) -> object:
        """Durations as plain seconds ("90") or ISO 8601 ("PT10M")."""
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                return value
        return value

    @field_validator("leader_check_timeout")
    @classmethod
    def _positive_timeout(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value <= timedelta(0):
            raise ValueError("must be positive")
        return value

    @field_validator("hardware_file")
    @classmethod
    def _hardware_is_usable(cls, value: Path | None) -> Path | None:
        """A broken hardware file stops the timekeeper at start, not a reconcile pass."""
        load_hardware(value)
        return value

    @property
    def hardware(self) -> GpuHardware:
        """Read from the file on each call; the reconciler reads it once, when it is built."""
        return load_hardware(self.hardware_file)

    @property
    def admitted_share_from_pod(self) -> bool:
        """Kubernetes auth mode: each report's token is bound to its pod, so a pod's admitted share is
        read from the pod itself when the pods table does not hold it yet (docs/timekeeper.md)."""
        return self.auth_mode == "kubernetes"

    @property
    def reports_trusted(self) -> bool:
        """Static auth mode: reporter tokens are an admin's, so a report's GPU model and utilisation are
        believed. Kubernetes auth mode: a report carries its pod's token; its model is its node's and its
        utilisation lowers nothing unless trust_reported_utilisation says so (docs/billing.md)."""
        return not self.admitted_share_from_pod

    @model_validator(mode="after")
    def _clock_is_complete(self) -> Settings:
        """A start without an origin (or a speed without a start) is refused at start-up, not guessed."""
        self.clock()
        return self

    @model_validator(mode="after")
    def _members_need_kubernetes(self) -> Settings:
        """A member's callers are known only by its API server's reviews: static tokens cannot say which
        cluster they come from, so a fleet runs in Kubernetes auth mode."""
        if self.members and self.auth_mode != "kubernetes":
            raise ValueError("members (a fleet) need TIMEKEEPER_AUTH_MODE=kubernetes")
        return self

    def clock(self) -> WallClock:
        return build_clock(self.clock_start, self.clock_speed, self.clock_origin, "TIMEKEEPER_")

    @field_validator("database_url")
    @classmethod
    def _normalise_url(cls, value: str | None) -> str | None:
        return normalise_database_url(value) if value else None


def _digest(value: str) -> str:
    digest = value.strip().lower()
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError("token digests must be 64 hex characters (SHA-256)")
    return digest


def normalise_database_url(url: str) -> str:
    """Every PostgreSQL URL goes through psycopg 3, which serves both the sync and the async engine."""
    for prefix in ("postgresql://", "postgres://", "postgresql+psycopg2://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


@lru_cache
def get_settings() -> Settings:
    """The process's settings, read once; tests build their own Settings instead."""
    return Settings()
