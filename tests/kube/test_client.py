"""The typed Kubernetes boundary, driven through the real `kubernetes` client against the stand-in server."""

from __future__ import annotations

import json
import threading

import kubernetes
import pytest
from kubernetes.client.exceptions import ApiException

from gpuaccounting.names import TOKEN_AUDIENCE
from tests.kube.factories import gpu_pod, pdb
from tests.support.kube_apiserver import KubeApiServer
from tests.support.kube_rbac import bind_namespace_viewer
from timekeeper.kube import (
    Backoff,
    EvictionResult,
    KubeClient,
    KubeError,
    ObjectReference,
    PodEvent,
    PodSnapshot,
    QuotaChange,
)
from timekeeper.kube.client import QUOTA_NAME
from timekeeper.kube.types import MANAGED_BY, MANAGED_BY_LABEL, POD_NAME_EXTRA, POD_UID_EXTRA


def test_token_review_names_the_pod_a_projected_token_is_bound_to(apiserver: KubeApiServer, kube: KubeClient):
    pod = gpu_pod(apiserver, "team-a", "trainer-0")
    token = apiserver.add_service_account_token("team-a", "default", [TOKEN_AUDIENCE], pod=pod)

    review = kube.token_review(token, (TOKEN_AUDIENCE,))

    assert review.authenticated
    assert review.username == "system:serviceaccount:team-a:default"
    assert review.extra_value(POD_NAME_EXTRA) == "trainer-0"
    assert review.extra_value(POD_UID_EXTRA) == pod["metadata"]["uid"]
    assert "system:serviceaccounts:team-a" in review.groups
    assert review.audiences == (TOKEN_AUDIENCE,)


def test_token_review_rejects_a_token_meant_for_another_audience(apiserver: KubeApiServer, kube: KubeClient):
    pod = gpu_pod(apiserver, "team-a", "trainer-0")
    api_token = apiserver.add_service_account_token("team-a", "default", pod=pod)

    review = kube.token_review(api_token, (TOKEN_AUDIENCE,))

    assert not review.authenticated
    assert "audiences" in review.error


def test_token_review_rejects_the_token_of_a_pod_that_is_gone(apiserver: KubeApiServer, kube: KubeClient):
    pod = gpu_pod(apiserver, "team-a", "trainer-0", phase="Succeeded")
    token = apiserver.add_service_account_token("team-a", "default", [TOKEN_AUDIENCE], pod=pod)
    apiserver.remove("v1", "Pod", "team-a", "trainer-0")

    assert not kube.token_review(token, (TOKEN_AUDIENCE,)).authenticated


def test_subject_access_review_answers_from_rbac(apiserver: KubeApiServer, kube: KubeClient):
    bind_namespace_viewer(apiserver, "team-a", "alice")

    def may(verb: str, namespace: str | None) -> bool:
        return kube.subject_access_review("alice", (), verb, "gpubudgets", "gpu-timekeeper.io", namespace)

    assert may("get", "team-a")
    assert not may("get", "team-b")
    assert not may("update", "team-a")
    assert not may("list", None)


def test_list_pods_reads_every_page(apiserver: KubeApiServer, kube: KubeClient):
    for i in range(5):
        gpu_pod(apiserver, "team-a", f"p{i}")

    snapshot = kube.list_pods(page_size=2)

    assert sorted(p.name for p in snapshot.pods) == [f"p{i}" for i in range(5)]
    assert apiserver.requests["list", "pods"] == 3
    assert int(snapshot.resource_version) == apiserver.resource_version


def test_pod_info_carries_share_phase_and_real_end_time(apiserver: KubeApiServer, kube: KubeClient):
    gpu_pod(apiserver, "team-a", "done", phase="Succeeded", share="0.5", finished_at="2026-11-22T00:30:00Z")
    (pod,) = kube.list_pods().pods
    assert pod.ended and pod.phase == "Succeeded"
    assert pod.annotations["gpu-timekeeper.io/gpu-share"] == "0.5"
    assert pod.finished_at is not None and pod.finished_at.isoformat() == "2026-11-22T00:30:00+00:00"
    assert pod.started_at is not None and pod.has_controller
    assert pod.raw["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}


def test_watch_streams_every_change_after_the_snapshot(apiserver: KubeApiServer, kube: KubeClient):
    gpu_pod(apiserver, "team-a", "first")
    stop = threading.Event()
    stream = kube.watch_pods(stop, timeout_seconds=5)

    snapshot = next(stream)
    assert isinstance(snapshot, PodSnapshot)
    assert [p.name for p in snapshot.pods] == ["first"]

    gpu_pod(apiserver, "team-a", "second", phase="Pending")
    gpu_pod(apiserver, "team-a", "second", phase="Running")
    apiserver.finish_pod_deletion("team-a", "first")

    events = [next(stream) for _ in range(3)]
    stop.set()
    assert [(e.type, e.pod.name, e.pod.phase) for e in events if isinstance(e, PodEvent)] == [
        ("ADDED", "second", "Pending"),
        ("MODIFIED", "second", "Running"),
        ("DELETED", "first", "Running"),
    ]
    assert apiserver.requests["list", "pods"] == 1


def test_watch_resumes_from_the_last_event_when_the_server_ends_it(
    apiserver: KubeApiServer, kube: KubeClient
):
    stop = threading.Event()
    stream = kube.watch_pods(stop, timeout_seconds=30)
    next(stream)
    gpu_pod(apiserver, "team-a", "a")
    assert next(stream).pod.name == "a"  # type: ignore[union-attr]

    # The server ends the watch; the client watches again from "a"'s resourceVersion, without a list.
    apiserver.end_watches()
    gpu_pod(apiserver, "team-a", "b")
    event = next(stream)
    stop.set()
    assert isinstance(event, PodEvent) and (event.type, event.pod.name) == ("ADDED", "b")
    assert apiserver.requests["watch", "pods"] == 2
    assert apiserver.requests["list", "pods"] == 1


def test_watch_lists_again_when_its_resource_version_has_expired(apiserver: KubeApiServer, kube: KubeClient):
    gpu_pod(apiserver, "team-a", "old")
    stop = threading.Event()
    stream = kube.watch_pods(stop, timeout_seconds=30)
    first = next(stream)
    assert isinstance(first, PodSnapshot)

    # Changes land while the watch is down, and the history they were in is compacted away: resuming from
    # the old resourceVersion answers 410 Expired, so the client must list again to see them.
    gpu_pod(apiserver, "team-a", "new")
    apiserver.finish_pod_deletion("team-a", "old")
    apiserver.compact()

    # (The generator is lazy: its watch request starts only now, from the compacted resourceVersion.)
    relisted = next(stream)
    stop.set()
    assert isinstance(relisted, PodSnapshot)
    assert [p.name for p in relisted.pods] == ["new"]
    assert apiserver.requests["list", "pods"] == 2


class _RecordingBackoff(Backoff):
    """Records each wait and restores access after the first, so the test needs no sleeping."""

    def __init__(self, on_first_wait) -> None:
        super().__init__(initial=0.01, maximum=0.02)
        self.delays: list[float] = []
        self._on_first_wait = on_first_wait

    def next_delay(self) -> float:
        delay = super().next_delay()
        self.delays.append(delay)
        if len(self.delays) == 1:
            self._on_first_wait()
        return delay


def test_watch_backs_off_on_errors_and_recovers(apiserver: KubeApiServer, kube: KubeClient):
    gpu_pod(apiserver, "team-a", "p")
    binding = apiserver.get("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", None, "gpu-timekeeper")
    assert binding is not None
    apiserver.remove("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", None, "gpu-timekeeper")
    backoff = _RecordingBackoff(on_first_wait=lambda: apiserver.put(binding))

    stop = threading.Event()
    snapshot = next(kube.watch_pods(stop, timeout_seconds=5, backoff=backoff))
    stop.set()

    assert isinstance(snapshot, PodSnapshot) and [p.name for p in snapshot.pods] == ["p"]
    assert len(backoff.delays) == 1


def test_eviction_honours_pod_disruption_budgets(apiserver: KubeApiServer, kube: KubeClient):
    gpu_pod(apiserver, "team-a", "guarded", labels={"app": "guarded"})
    gpu_pod(apiserver, "team-a", "free", labels={"app": "free"})
    pdb(apiserver, "team-a", "guarded-pdb", {"app": "guarded"}, allowed=0)

    assert kube.evict_pod("team-a", "guarded") is EvictionResult.BLOCKED_BY_PDB
    assert apiserver.get("v1", "Pod", "team-a", "guarded")["metadata"].get("deletionTimestamp") is None

    assert kube.evict_pod("team-a", "free") is EvictionResult.EVICTED
    assert apiserver.get("v1", "Pod", "team-a", "free")["metadata"]["deletionTimestamp"]

    assert kube.evict_pod("team-a", "never-existed") is EvictionResult.GONE


def test_eviction_allowed_by_a_budget_spends_it(apiserver: KubeApiServer, kube: KubeClient):
    for name in ("r1", "r2"):
        gpu_pod(apiserver, "team-a", name, labels={"app": "serve"})
    pdb(apiserver, "team-a", "serve-pdb", {"app": "serve"}, allowed=1)

    assert kube.evict_pod("team-a", "r1") is EvictionResult.EVICTED
    assert kube.evict_pod("team-a", "r2") is EvictionResult.BLOCKED_BY_PDB


@pytest.mark.parametrize(
    ("served", "sent"),
    [(("v1", "v1beta1"), "policy/v1"), (("v1beta1",), "policy/v1beta1")],
    ids=["1.22-and-later", "1.20"],
)
def test_eviction_speaks_the_policy_version_the_server_serves(
    apiserver: KubeApiServer, kube: KubeClient, served: tuple[str, ...], sent: str
):
    """The stand-in refuses an Eviction of a version it does not serve, as a 1.20 API server refuses
    policy/v1."""
    apiserver.eviction_versions = served
    gpu_pod(apiserver, "team-a", "trainer")

    assert kube.evict_pod("team-a", "trainer") is EvictionResult.EVICTED
    assert kube.eviction_api_version() == sent


def test_quota_is_created_labelled_then_drift_is_corrected(apiserver: KubeApiServer, kube: KubeClient):
    hard = {"requests.nvidia.com/gpu": "4", "requests.tencent.com/vcuda-core": "400"}

    assert kube.apply_resource_quota("team-a", hard) is QuotaChange.CREATED
    quota = apiserver.get("v1", "ResourceQuota", "team-a", QUOTA_NAME)
    assert quota["spec"]["hard"] == hard
    assert quota["metadata"]["labels"][MANAGED_BY_LABEL] == MANAGED_BY
    assert kube.apply_resource_quota("team-a", hard) is QuotaChange.UNCHANGED

    # Someone raises the quota by hand; the next pass puts it back.
    quota["spec"]["hard"]["requests.nvidia.com/gpu"] = "40"
    apiserver.put(quota)
    assert kube.apply_resource_quota("team-a", hard) is QuotaChange.UPDATED
    assert apiserver.get("v1", "ResourceQuota", "team-a", QUOTA_NAME)["spec"]["hard"] == hard


def test_quota_compares_quantities_by_value(apiserver: KubeApiServer, kube: KubeClient):
    kube.apply_resource_quota("team-a", {"requests.cnvrg.io/metagpu": "0.5"})
    quota = apiserver.get("v1", "ResourceQuota", "team-a", QUOTA_NAME)
    quota["spec"]["hard"]["requests.cnvrg.io/metagpu"] = "500m"  # as the API server canonicalises it
    apiserver.put(quota)

    assert kube.apply_resource_quota("team-a", {"requests.cnvrg.io/metagpu": "0.5"}) is QuotaChange.UNCHANGED


def test_quotas_are_found_and_removed(apiserver: KubeApiServer, kube: KubeClient):
    kube.apply_resource_quota("team-a", {"requests.nvidia.com/gpu": "1"})
    kube.apply_resource_quota("team-b", {"requests.nvidia.com/gpu": "2"})
    apiserver.put(
        {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "theirs", "namespace": "team-c"}}
    )

    assert kube.managed_quota_namespaces() == {"team-a", "team-b"}
    assert kube.delete_resource_quota("team-a") is QuotaChange.DELETED
    assert kube.delete_resource_quota("team-a") is QuotaChange.ABSENT
    assert kube.managed_quota_namespaces() == {"team-b"}


def test_events_are_posted_on_the_namespace_or_a_pod(apiserver: KubeApiServer, kube: KubeClient):
    kube.post_event("team-a", "BudgetExhausted", "team-a spent 600 of 600 GPU-minutes", "Warning")
    kube.post_event(
        "team-a",
        "Downgraded",
        "evicted to restart at the reduced class",
        involved=ObjectReference("Pod", "p"),
    )

    events = apiserver.list("v1", "Event", "team-a")
    about = {(e["involvedObject"]["kind"], e["involvedObject"]["name"]): e for e in events}
    assert about["Namespace", "team-a"]["reason"] == "BudgetExhausted"
    assert about["Namespace", "team-a"]["type"] == "Warning"
    assert about["Pod", "p"]["involvedObject"]["namespace"] == "team-a"
    assert all(e["source"]["component"] == "gpu-timekeeper" for e in events)


def test_a_missing_rbac_rule_surfaces_as_a_kube_error(apiserver: KubeApiServer):
    token = apiserver.add_service_account_token("elsewhere", "nobody")
    client = KubeClient(apiserver.client_configuration(token))
    with pytest.raises(KubeError, match="403"):
        client.post_event("team-a", "BudgetExhausted", "x")
    client.close()


# ---- the stand-in answers errors as the real API server does -------------------------------------------


def _core(apiserver: KubeApiServer, token: str) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(apiserver.client_configuration(token)))


def test_stand_in_errors_are_status_objects(apiserver: KubeApiServer):
    core = _core(apiserver, apiserver.add_user("root", ["system:masters"]))
    secret = kubernetes.client.V1Secret(
        metadata=kubernetes.client.V1ObjectMeta(name="s"), string_data={"a": "b"}
    )

    with pytest.raises(ApiException) as missing:
        core.read_namespaced_secret("s", "team-a")
    created = core.create_namespaced_secret("team-a", secret)
    with pytest.raises(ApiException) as exists:
        core.create_namespaced_secret("team-a", secret)
    created.metadata.resource_version = "1"
    with pytest.raises(ApiException) as conflict:
        core.replace_namespaced_secret("s", "team-a", created)

    for error, code, reason in (
        (missing, 404, "NotFound"),
        (exists, 409, "AlreadyExists"),
        (conflict, 409, "Conflict"),
    ):
        body = json.loads(error.value.body)
        assert (error.value.status, body["kind"], body["code"], body["reason"]) == (
            code,
            "Status",
            code,
            reason,
        )


def test_stand_in_requires_a_valid_token(apiserver: KubeApiServer):
    with pytest.raises(ApiException) as error:
        _core(apiserver, "not-a-token").list_namespaced_pod("team-a")
    assert error.value.status == 401


def test_stand_in_patches_webhook_configurations_by_merge(apiserver: KubeApiServer):
    api_client = kubernetes.client.ApiClient(
        apiserver.client_configuration(apiserver.add_user("r", ["system:masters"]))
    )
    admission = kubernetes.client.AdmissionregistrationV1Api(api_client)
    apiserver.put(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "gpu-timekeeper"},
            "webhooks": [
                {
                    "name": "pods.gpu-timekeeper.io",
                    "clientConfig": {"service": {"name": "w", "namespace": "gpu-timekeeper"}},
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                }
            ],
        }
    )
    patch = {"webhooks": [{"name": "pods.gpu-timekeeper.io", "clientConfig": {"caBundle": "Q0E="}}]}

    patched = admission.patch_mutating_webhook_configuration("gpu-timekeeper", patch)

    (webhook,) = patched.webhooks
    assert webhook.client_config.ca_bundle == "Q0E="
    assert webhook.client_config.service.name == "w"
