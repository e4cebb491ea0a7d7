"""DRA pods at admission: a pod whose GPUs come through resource claims gets its namespace's class, a
sidecar that lists its GPU claims and is governed like its device-plugin equivalent; a claim that does not
exist fails closed. The app runs in-process with its DRA view filled as its watch would fill it (the
watch itself, with the API server, is tests/cluster/test_dra.py's)."""

from __future__ import annotations

import base64
import copy
from collections.abc import Iterator
from typing import Any

import jsonpatch
import kubernetes_validate
import orjson
import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from gpuaccounting import names
from tests.support.admission_state_server import entry, snapshot
from tests.support.dra import (
    DEVICE_CLASSES,
    HAMI_CLASS,
    QUICKSTART,
    SINGLE_GPU,
    claim,
    claim_spec,
    claiming_pod,
    request,
    template,
)
from tests.support.pods import container, pod, review
from webhook.serving.app import create_app
from webhook.settings import WebhookSettings
from webhook.watches.dra import CLAIMS, CLASSES, TEMPLATES

EXHAUSTED = "team-x"
CAPPED = "team-c"


@pytest.fixture(scope="module")
def app() -> Starlette:
    built = create_app(WebhookSettings(watch_priority_classes=False))
    namespaces = {EXHAUSTED: entry("exhausted"), CAPPED: entry("in_budget", 0.5)}
    built.state.cache.store(snapshot(namespaces=namespaces), '"1"')
    dra = built.state.admission.dra
    for device_class in DEVICE_CLASSES:
        dra.put(CLASSES, device_class)
    for namespace in (EXHAUSTED, CAPPED):
        for case, (spec, _) in QUICKSTART.items():
            dra.put(TEMPLATES, template(case, namespace, spec))
        dra.put(CLAIMS, claim("shared-gpu", namespace, SINGLE_GPU))
    return built


@pytest.fixture(scope="module")
def client(app: Starlette) -> Iterator[TestClient]:
    yield TestClient(app)  # not entered: no lifespan, no poller, no watch


def post(client: TestClient, path: str, pod: dict[str, Any]) -> dict[str, Any]:
    answer = client.post(
        path, content=orjson.dumps(review(pod)), headers={"content-type": "application/json"}
    )
    assert answer.status_code == 200, answer.text
    response: dict[str, Any] = answer.json()["response"]
    return response


def admit(client: TestClient, original: dict[str, Any]) -> dict[str, Any]:
    response = post(client, "/mutate", original)
    patch = orjson.loads(base64.b64decode(response["patch"]))
    return jsonpatch.apply_patch(copy.deepcopy(original), patch)


def sidecar_claims(patched: dict[str, Any]) -> list[dict[str, str]]:
    (sidecar,) = [c for c in patched["spec"]["initContainers"] if c["name"] == names.SIDECAR_CONTAINER_NAME]
    return list(sidecar["resources"].get("claims", []))


@pytest.mark.parametrize("case", sorted(QUICKSTART))
def test_a_dra_pod_in_an_exhausted_namespace_gets_the_reduced_class_and_a_sidecar_listing_its_claim(
    client: TestClient, case: str
) -> None:
    patched = admit(client, claiming_pod(EXHAUSTED, templates={"gpu": case}, containers=2))
    kubernetes_validate.validate(patched, kubernetes_validate.utils.latest_version(), strict=True)
    assert patched["spec"]["priorityClassName"] == "gpu-over-budget"
    assert patched["metadata"]["annotations"][names.ANNOTATION_GPU_SHARE] == QUICKSTART[case][1]
    assert sidecar_claims(patched) == [{"name": "gpu"}]
    assert post(client, "/validate", patched)["allowed"]


def test_a_named_claim_is_read_like_a_template(client: TestClient) -> None:
    patched = admit(client, claiming_pod(EXHAUSTED, claims={"shared": "shared-gpu"}))
    annotations = patched["metadata"]["annotations"]
    assert (annotations[names.ANNOTATION_GPU_SHARE], annotations[names.ANNOTATION_SHARING_SYSTEM]) == (
        "1",
        "nvidia",
    )
    assert sidecar_claims(patched) == [{"name": "shared"}]


def test_each_dra_pod_takes_its_device_classes_sharing_system(client: TestClient) -> None:
    systems = {
        case: admit(client, claiming_pod(EXHAUSTED, templates={"gpu": case}))["metadata"]["annotations"][
            names.ANNOTATION_SHARING_SYSTEM
        ]
        for case in ("gpu-test1", "gpu-test6", "hami-cores")
    }
    assert systems == {"gpu-test1": "nvidia", "gpu-test6": "nvidia-mig", "hami-cores": "hami"}


def test_a_claim_that_does_not_exist_fails_closed(client: TestClient) -> None:
    original = claiming_pod(EXHAUSTED, claims={"gpu": "not-yet"})
    assert "patch" not in post(client, "/mutate", original)  # no GPUs known: nothing to inject
    answer = post(client, "/validate", original)
    assert not answer["allowed"]
    assert "ResourceClaim not-yet does not exist" in answer["status"]["message"]
    assert "rule dra-claim" in answer["status"]["message"]


def test_dra_pods_are_governed_like_their_device_plugin_equivalents(client: TestClient) -> None:
    """The namespace's per-pod cap of 0.5 GPU denies HAMi's 0.9 and a whole GPU alike, by either route."""
    through_claims = post(
        client, "/validate", admit(client, claiming_pod(CAPPED, templates={"gpu": "hami-cores"}))
    )
    through_plugin = post(
        client,
        "/validate",
        admit(
            client, pod(container("c", {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 90}), namespace=CAPPED)
        ),
    )
    for answer in (through_claims, through_plugin):
        assert not answer["allowed"]
        assert "0.9 is above this namespace's per-pod cap of 0.5" in answer["status"]["message"]


def test_a_sidecar_without_the_pods_claims_is_refused(client: TestClient) -> None:
    patched = admit(client, claiming_pod(EXHAUSTED, templates={"gpu": "gpu-test1"}))
    sidecar = patched["spec"]["initContainers"][0]
    del sidecar["resources"]["claims"]
    answer = post(client, "/validate", patched)
    assert (
        not answer["allowed"]
        and "resources.claims are not the pod's GPU claims" in answer["status"]["message"]
    )


def test_a_dra_pod_below_its_systems_floor_is_refused(app: Starlette, client: TestClient) -> None:
    tiny = claim_spec(request("gpu", HAMI_CLASS, capacity={"requests": {"memory": "1Mi"}}))
    app.state.admission.dra.put(TEMPLATES, template("hami-tiny", EXHAUSTED, tiny))
    answer = post(client, "/validate", admit(client, claiming_pod(EXHAUSTED, templates={"gpu": "hami-tiny"})))
    assert not answer["allowed"]
    assert (
        "for hami, 0.01 (hardware file: minimum_shares) (rule minimum-share)" in answer["status"]["message"]
    )


def test_an_update_may_not_change_the_pods_claims(client: TestClient) -> None:
    """The claims are what a DRA pod's share is read from, like a container's GPU requests."""
    old = admit(client, claiming_pod(EXHAUSTED, templates={"gpu": "gpu-test1"}))
    new = copy.deepcopy(old)
    new["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] = "gpu-test4"
    answer = client.post(
        "/validate",
        content=orjson.dumps(review(new, operation="UPDATE", old=old)),
        headers={"content-type": "application/json"},
    ).json()["response"]
    assert not answer["allowed"]
    assert "spec.resourceClaims=" in answer["status"]["message"]
    assert "rule protected-share-inputs" in answer["status"]["message"]
