"""The stand-in API server answers as the real one does, checked through the `kubernetes` client (the
webhook's bootstrap uses it)."""

from __future__ import annotations

import json

import kubernetes
import pytest
from kubernetes.client.exceptions import ApiException

from tests.support.kube_apiserver import KubeApiServer


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
