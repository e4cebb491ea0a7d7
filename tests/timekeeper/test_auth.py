"""Static tokens: admin changes need an admin token, reports a reporter's, reads any accepted token;
a credential bound to one pod reports only for that pod."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import httpx
import pytest
from fastapi import FastAPI
from pydantic import ValidationError

from gpuaccounting.names import CLUSTER_HEADER, PROXIED_AUTHORIZATION_HEADER
from tests.support.timekeeper import Api, Tokens, bearer, ok, report_body, sha256
from tests.timekeeper.conftest import START
from timekeeper.app import current, expose
from timekeeper.auth.base import Action, PodIdentity, Principal
from timekeeper.auth.dependencies import ACCESS
from timekeeper.auth.static import StaticAccessControl
from timekeeper.settings import Settings

pytestmark = pytest.mark.asyncio(loop_scope="session")

REPORT = report_body(start=START - timedelta(minutes=5))
BUDGET = {"budget_gpu_minutes": 10}
ADMIN_CALLS = [
    ("PUT", "/namespaces/team-a/budget", BUDGET),
    ("DELETE", "/namespaces/team-a/budget", None),
    ("GET", "/defaults", None),
    ("PUT", "/defaults", BUDGET),
    ("POST", "/namespaces/team-a/grants", {"gpu_minutes": 5, "reason": "x"}),
    ("GET", "/audit", None),
]
READ_CALLS = ["/namespaces", "/namespaces/team-a/budget", "/namespaces/team-a/usage", "/admission-state"]


async def call(
    client: httpx.AsyncClient, method: str, path: str, body: object, headers: dict
) -> httpx.Response:
    return await client.request(method, path, json=body, headers=headers)


@pytest.mark.parametrize(("method", "path", "body"), ADMIN_CALLS)
async def test_admin_calls_without_a_token_are_refused_with_401(
    api: Api, method: str, path: str, body: object
) -> None:
    response = await call(api.client, method, path, body, {})

    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(("method", "path", "body"), ADMIN_CALLS)
async def test_admin_calls_with_a_wrong_token_are_refused_with_401(
    api: Api, method: str, path: str, body: object
) -> None:
    response = await call(api.client, method, path, body, bearer("not-a-token"))

    assert response.status_code == 401


@pytest.mark.parametrize(("method", "path", "body"), ADMIN_CALLS)
async def test_admin_calls_with_a_reporter_or_reader_token_are_forbidden(
    api: Api, method: str, path: str, body: object
) -> None:
    for token in (api.tokens.reporter, api.tokens.reader):
        response = await call(api.client, method, path, body, bearer(token))
        assert response.status_code == 403


async def test_a_refused_admin_call_changes_nothing(api: Api) -> None:
    await call(api.client, "PUT", "/namespaces/team-a/budget", BUDGET, bearer(api.tokens.reporter))

    assert (await api.budget("team-a"))["source"] == "default"
    assert ok(await api.get("/audit")) == []


async def test_reports_need_a_reporter_or_admin_token(api: Api) -> None:
    assert (await api.client.post("/reports", json=REPORT)).status_code == 401
    assert (await api.client.post("/reports", json=REPORT, headers=bearer("nope"))).status_code == 401
    assert (
        await api.client.post("/reports", json=REPORT, headers=bearer(api.tokens.reader))
    ).status_code == 403
    assert (
        await api.client.post("/reports", json=REPORT, headers=bearer(api.tokens.reporter))
    ).status_code == 200
    assert (
        await api.client.post("/reports", json=REPORT, headers=bearer(api.tokens.admin))
    ).status_code == 200


@pytest.mark.parametrize("path", READ_CALLS)
async def test_reads_need_an_accepted_token(api: Api, path: str) -> None:
    assert (await api.client.get(path)).status_code == 401
    assert (await api.client.get(path, headers=bearer("nope"))).status_code == 401
    for token in (api.tokens.reader, api.tokens.reporter, api.tokens.admin):
        assert (await api.client.get(path, headers=bearer(token))).status_code == 200


@pytest.mark.parametrize("path", READ_CALLS)
async def test_anonymous_reads_when_configured(api: Api, app: FastAPI, path: str) -> None:
    context = current(app)
    expose(app, replace(context, settings=context.settings.model_copy(update={"anonymous_read": True})))

    assert (await api.client.get(path)).status_code == 200
    assert (await api.client.put("/defaults", json=BUDGET)).status_code == 401


class PodBoundAccess:
    """The most faithful stand-in for Kubernetes mode: every token is a pod's projected token."""

    async def authenticate(self, token: str, cluster: str | None) -> Principal | None:
        namespace, name, uid = token.split("/")
        return Principal(
            name=f"system:serviceaccount:{namespace}:default", pod=PodIdentity(namespace, name, uid)
        )

    async def authorize(self, principal: Principal, action: Action, namespace: str | None) -> bool:
        return action is Action.REPORT and principal.pod is not None and principal.pod.namespace == namespace

    async def aclose(self) -> None:
        return None


@pytest.mark.parametrize(
    ("token", "status"),
    [
        ("team-a/trainer-0/uid-trainer-0", 200),
        ("team-a/trainer-0/uid-someone-else", 403),
        ("team-a/trainer-1/uid-trainer-0", 403),
        ("team-b/trainer-0/uid-trainer-0", 403),
    ],
)
async def test_a_pod_bound_credential_reports_only_for_its_own_pod(
    app: FastAPI, client: httpx.AsyncClient, token: str, status: int
) -> None:
    expose(app, current(app).with_part(ACCESS, PodBoundAccess()))

    response = await client.post("/reports", json=REPORT, headers=bearer(token))

    assert response.status_code == status


async def test_static_principals_name_the_role_never_the_token() -> None:
    tokens = Tokens()
    access = StaticAccessControl([sha256(tokens.admin)], [sha256(tokens.reporter)], [])

    admin = await access.authenticate(tokens.admin)
    reporter = await access.authenticate(tokens.reporter)

    assert admin is not None and reporter is not None
    assert admin.name.startswith("admin-token:") and tokens.admin not in admin.name
    assert await access.authorize(admin, Action.ADMIN, None)
    assert not await access.authorize(reporter, Action.ADMIN, None)
    assert await access.authorize(reporter, Action.REPORT, "team-a")
    assert await access.authenticate(tokens.reader) is None


async def test_malformed_token_digests_are_refused_at_start() -> None:
    with pytest.raises(ValidationError):
        Settings(admin_token_sha256="not-a-digest")
    assert Settings(admin_token_sha256=f" {sha256('a')} , {sha256('b').upper()} ").admin_token_sha256 == (
        sha256("a"),
        sha256("b"),
    )


async def test_a_token_repeated_for_the_api_servers_proxy_counts_as_the_bearer_token(api: Api) -> None:
    # The API server's service proxy removes Authorization; `kubectl gpu-budget` repeats the token here.
    proxied = {PROXIED_AUTHORIZATION_HEADER: f"Bearer {api.tokens.admin}"}

    assert (await call(api.client, "PUT", "/namespaces/team-a/budget", BUDGET, proxied)).status_code == 200
    assert ok(await api.get("/audit"))[0]["actor"].startswith("admin-token:")
    reader = {PROXIED_AUTHORIZATION_HEADER: f"Bearer {api.tokens.reader}"}
    assert (await call(api.client, "PUT", "/defaults", BUDGET, reader)).status_code == 403
    assert (await api.client.get("/namespaces", headers=reader)).status_code == 200


@pytest.mark.parametrize("value", ["Bearer not-a-token", "Basic YWRtaW46YWRtaW4=", "Bearer ", "garbage"])
async def test_a_proxied_token_not_accepted_is_refused_like_any_other(api: Api, value: str) -> None:
    response = await api.client.get("/namespaces", headers={PROXIED_AUTHORIZATION_HEADER: value})

    assert response.status_code == 401


async def test_the_authorization_header_wins_over_the_proxied_one(api: Api) -> None:
    both = bearer(api.tokens.reader) | {PROXIED_AUTHORIZATION_HEADER: f"Bearer {api.tokens.admin}"}

    assert (await call(api.client, "GET", "/audit", None, both)).status_code == 403


@pytest.mark.parametrize("authorization", ["", "Basic YWRtaW46YWRtaW4=", "Bearer "])
async def test_an_authorization_header_without_a_bearer_token_hides_the_proxied_one(
    api: Api, authorization: str
) -> None:
    # Only a request that has no Authorization at all came through the API server's proxy.
    headers = {"authorization": authorization, PROXIED_AUTHORIZATION_HEADER: f"Bearer {api.tokens.admin}"}

    assert (await call(api.client, "GET", "/audit", None, headers)).status_code == 401


@pytest.mark.parametrize(("method", "path", "body"), [*ADMIN_CALLS, ("POST", "/reports", REPORT)])
async def test_a_cluster_the_timekeeper_does_not_serve_is_a_400_whatever_the_token(
    api: Api, method: str, path: str, body: object
) -> None:
    """Static mode has no member clusters (docs/fleet.md): a request naming one is refused as a mistake,
    with a sentence naming the cluster, before its token is looked at; never a 500, nor a local answer."""
    for token in (api.tokens.admin, api.tokens.reporter, "not-a-token"):
        response = await call(api.client, method, path, body, bearer(token) | {CLUSTER_HEADER: "a"})
        assert response.status_code == 400, response.text
        assert "'a'" in response.json()["detail"]


async def test_an_empty_cluster_header_is_the_local_cluster(api: Api) -> None:
    response = await call(
        api.client, "GET", "/namespaces/team-a/budget", None, bearer(api.tokens.admin) | {CLUSTER_HEADER: ""}
    )
    assert response.status_code == 200
