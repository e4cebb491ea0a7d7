"""A hub serving member clusters (docs/fleet.md), through the app's HTTP layer and the real database, with
one stand-in API server per cluster (the local one and members `a` and `b`, each with its own tokens and
RBAC): a token is reviewed by the cluster the request names, a namespace in a path or a report means that
cluster's (its namespace key), and each member's webhook sees only its cluster's namespaces. The same on
two real API servers, with the webhooks: the cluster suite's fleet test. Each stand-in has its own
`kube-system` namespace (its uid: the cluster's identity), as a real API server has."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpuaccounting.names import CLUSTER_HEADER, TOKEN_AUDIENCE
from tests.kube.factories import gpu_pod
from tests.support.kube_apiserver import KubeApiServer
from tests.support.kube_rbac import (
    TIMEKEEPER_NAMESPACE,
    TIMEKEEPER_SERVICE_ACCOUNT,
    bind_cluster_wide,
    bind_namespace_viewer,
    install_cluster_roles,
)
from tests.support.timekeeper import bearer, ok, report_body
from tests.timekeeper.conftest import START
from timekeeper.auth.kubernetes import RETRY_AFTER_SECONDS, build_access_control
from timekeeper.errors import TimekeeperError
from timekeeper.settings import Member, Settings

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture
def members(apiserver: KubeApiServer) -> Iterator[dict[str, KubeApiServer]]:
    apiserver.with_identity()  # the hub's own cluster
    servers: dict[str, KubeApiServer] = {}
    try:
        for name in ("a", "b"):
            servers[name] = KubeApiServer().start().with_identity()
            install_cluster_roles(servers[name])
        yield servers
    finally:
        for server in servers.values():
            server.stop()


@pytest.fixture
def settings_update() -> dict[str, Any]:
    """What a test changes in the settings besides the members (parametrized where it does)."""
    return {}


@pytest.fixture
def settings(
    settings: Settings, members: dict[str, KubeApiServer], tmp_path: Path, settings_update: dict[str, Any]
) -> Settings:
    """The local stand-in's settings (tests/kube/conftest.py) with a kubeconfig per member, holding the
    timekeeper's ServiceAccount token of that member; without the background scheduler."""
    configs = {}
    for name, server in members.items():
        token = server.add_service_account_token(TIMEKEEPER_NAMESPACE, TIMEKEEPER_SERVICE_ACCOUNT)
        configs[name] = Member(kubeconfig=server.write_kubeconfig(tmp_path / f"kubeconfig-{name}", token))
    return settings.model_copy(update={"scheduler_enabled": False, "members": configs, **settings_update})


def of(cluster: str | None, token: str) -> dict[str, str]:
    """A request's headers: the token, and the cluster it is of (None: the local one, no header)."""
    return bearer(token) | ({} if cluster is None else {CLUSTER_HEADER: cluster})


def pod_token(server: KubeApiServer, pod: dict[str, Any]) -> str:
    return server.add_service_account_token(
        pod["metadata"]["namespace"], "default", [TOKEN_AUDIENCE], pod=pod
    )


def report(pod: dict[str, Any], seq: int = 1, minutes: float = 5) -> dict[str, Any]:
    meta = pod["metadata"]
    return report_body(
        namespace=meta["namespace"],
        pod=meta["name"],
        pod_uid=meta["uid"],
        seq=seq,
        start=START - timedelta(minutes=60 - 5 * seq),
        minutes=minutes,
    )


def cluster_reader(server: KubeApiServer, name: str) -> str:
    token = server.add_user(name)
    bind_cluster_wide(server, name, "gpu-timekeeper-viewer")
    return token


async def test_a_member_pod_reports_under_its_key_and_only_with_its_own_cluster(
    apiserver: KubeApiServer, members: dict[str, KubeApiServer], client: httpx.AsyncClient
):
    a = members["a"]
    pod = gpu_pod(a, "team-x", "trainer-0")
    token = pod_token(a, pod)

    # Named as b's, or as the local cluster's (no header), the token is reviewed there and refused.
    for cluster in ("b", None):
        refused = await client.post("/reports", json=report(pod), headers=of(cluster, token))
        assert refused.status_code == 401, refused.text
    charged = ok(await client.post("/reports", json=report(pod), headers=of("a", token)))
    assert charged["gpu_minutes"] == 5.0  # the share read from the pod in a's API server

    a_usage = ok(await client.get("/namespaces/team-x/usage", headers=of("a", cluster_reader(a, "ops-a"))))
    assert (a_usage["namespace"], a_usage["cluster"], a_usage["total_gpu_minutes"]) == ("team-x", "a", 5.0)
    local_reader = cluster_reader(apiserver, "ops")
    local_usage = ok(await client.get("/namespaces/team-x/usage", headers=of(None, local_reader)))
    assert local_usage["total_gpu_minutes"] == 0.0  # the local cluster's team-x is another namespace
    b_usage = ok(
        await client.get("/namespaces/team-x/usage", headers=of("b", cluster_reader(members["b"], "o")))
    )
    assert b_usage["total_gpu_minutes"] == 0.0


@pytest.mark.parametrize("victim", [None, "a"])
async def test_a_member_that_claims_another_clusters_pod_uid_charges_only_its_own_pod(
    victim: str | None, apiserver: KubeApiServer, members: dict[str, KubeApiServer], client: httpx.AsyncClient
):
    """Member b's admin makes b's API server answer a pod of b with the uid of a pod of another cluster
    (the hub's own, or member a's): each pod is charged under its own cluster, fully and once, whichever
    reports first. Keyed by uid alone, b's first report owned the uid and the victim's were refused (409):
    its tenant's GPU time escaped its budget."""
    victim_server, b = {None: apiserver, "a": members["a"]}[victim], members["b"]
    pod = gpu_pod(victim_server, "team-x", "trainer-0")
    victim_token = pod_token(victim_server, pod)
    gpu_pod(b, "team-x", "claimer")
    claimer = b.forge_uid("team-x", "claimer", pod["metadata"]["uid"])
    claimer_token = pod_token(b, claimer)

    def charged(answer: dict[str, Any]) -> tuple[bool, float]:
        return answer["duplicate"], answer["gpu_minutes"]

    first = ok(await client.post("/reports", json=report(claimer, 1), headers=of("b", claimer_token)))
    assert charged(first) == (False, 5.0)
    for seq in (1, 2):  # the same seq and intervals as b's: neither a retry of b's nor time b covered
        own = ok(await client.post("/reports", json=report(pod, seq), headers=of(victim, victim_token)))
        assert charged(own) == (False, 5.0)
    later = ok(await client.post("/reports", json=report(claimer, 2), headers=of("b", claimer_token)))
    assert charged(later) == (False, 5.0)
    retried = ok(await client.post("/reports", json=report(pod, 1), headers=of(victim, victim_token)))
    assert charged(retried) == (True, 0.0)

    reader = of(victim, cluster_reader(victim_server, "ops"))
    victims = ok(await client.get("/namespaces/team-x/usage", headers=reader))
    assert [(row["key"], row["gpu_minutes"]) for row in victims["rows"]] == [("trainer-0", 10.0)]
    b_usage = ok(await client.get("/namespaces/team-x/usage", headers=of("b", cluster_reader(b, "ops-b"))))
    assert [(row["key"], row["gpu_minutes"]) for row in b_usage["rows"]] == [("claimer", 10.0)]


async def test_a_member_reader_reads_its_own_namespaces_only(
    apiserver: KubeApiServer, members: dict[str, KubeApiServer], client: httpx.AsyncClient
):
    a, b = members["a"], members["b"]
    alice = a.add_user("alice")
    bind_namespace_viewer(a, "team-x", "alice")
    bind_namespace_viewer(b, "team-x", "alice")  # b's alice is b's: a's token is no credential there
    for server, cluster in ((a, "a"), (b, "b")):
        pod = gpu_pod(server, "team-x", "trainer-0")
        ok(await client.post("/reports", json=report(pod), headers=of(cluster, pod_token(server, pod))))

    # Named as every answer names a namespace: bare, with its cluster beside it (never the key `a/team-x`).
    budget = ok(await client.get("/namespaces/team-x/budget", headers=of("a", alice)))
    assert (budget["namespace"], budget["cluster"]) == ("team-x", "a")
    assert (await client.get("/namespaces/team-x/budget", headers=of("b", alice))).status_code == 401
    assert (await client.get("/namespaces/team-y/budget", headers=of("a", alice))).status_code == 403
    listed = ok(await client.get("/namespaces", headers=of("a", alice)))
    assert [(status["cluster"], status["namespace"]) for status in listed] == [("a", "team-x")]

    # A cluster-wide reader of a lists a's namespaces only; the hub's own cluster-wide reader, the fleet's.
    ops_a = ok(await client.get("/namespaces", headers=of("a", cluster_reader(a, "ops-a"))))
    assert [(status["cluster"], status["namespace"]) for status in ops_a] == [("a", "team-x")]
    hub = ok(await client.get("/namespaces", headers=of(None, cluster_reader(apiserver, "ops"))))
    assert {("a", "team-x"), ("b", "team-x")} <= {(status["cluster"], status["namespace"]) for status in hub}


async def test_an_unknown_cluster_is_a_400_that_names_it(apiserver: KubeApiServer, client: httpx.AsyncClient):
    reader = cluster_reader(apiserver, "ops")
    for path in ("/namespaces/team-x/budget", "/namespaces", "/admission-state", "/whoami"):
        response = await client.get(path, headers=of("c", reader))
        assert response.status_code == 400, (path, response.text)
        assert "'c'" in response.json()["detail"]
    anonymous = await client.get("/namespaces/team-x/budget", headers={CLUSTER_HEADER: "c"})
    assert anonymous.status_code == 400


async def test_a_member_admin_changes_its_namespaces_not_the_fleet(
    apiserver: KubeApiServer, members: dict[str, KubeApiServer], client: httpx.AsyncClient
):
    a = members["a"]
    admin = a.add_user("admin-a")
    bind_cluster_wide(a, "admin-a", "gpu-timekeeper-admin")
    body = {"budget_gpu_minutes": 0, "period": "monthly"}

    put = ok(await client.put("/namespaces/team-x/budget", json=body, headers=of("a", admin)))
    assert (put["namespace"], put["cluster"], put["state"]) == ("team-x", "a", "exhausted")
    # What every cluster shares is the hub's own cluster's to change and to read.
    for path in ("/defaults", "/billing/charge-basis", "/billing/prices/h100"):
        assert (await client.put(path, json=body, headers=of("a", admin))).status_code == 403, path
    assert (await client.get("/audit", headers=of("a", admin))).status_code == 403

    # Each cluster's webhook sees its own namespaces by bare name; the local one none of a member's.
    webhook_a = cluster_reader(a, "webhook-a")
    snapshot_a = ok(await client.get("/admission-state", headers=of("a", webhook_a)))
    assert snapshot_a["namespaces"]["team-x"]["state"] == "exhausted"
    snapshot_b = ok(await client.get("/admission-state", headers=of("b", cluster_reader(members["b"], "w"))))
    local = ok(await client.get("/admission-state", headers=of(None, cluster_reader(apiserver, "w"))))
    for snapshot in (snapshot_b, local):
        assert "team-x" not in snapshot["namespaces"]
        assert not any("/" in namespace for namespace in snapshot["namespaces"])
    assert snapshot_a["version"] == snapshot_b["version"] == local["version"]


def cluster_admin(server: KubeApiServer, name: str) -> str:
    token = server.add_user(name)
    bind_cluster_wide(server, name, "gpu-timekeeper-admin")
    return token


async def test_a_pool_across_clusters_is_exhausted_by_one_and_moves_the_others_snapshot(
    apiserver: KubeApiServer, members: dict[str, KubeApiServer], client: httpx.AsyncClient
):
    a, b = members["a"], members["b"]
    hub_admin = cluster_admin(apiserver, "hub-admin")
    shared = {"budget_gpu_minutes": 8, "members": [{"namespace": "a/team-x"}, {"namespace": "b/team-x"}]}
    pool = ok(await client.put("/pools/shared", json=shared, headers=of(None, hub_admin)))
    assert [member["namespace"] for member in pool["members"]] == ["a/team-x", "b/team-x"]
    unknown = {"budget_gpu_minutes": 8, "members": [{"namespace": "c/team-x"}]}
    assert (await client.put("/pools/other", json=unknown, headers=of(None, hub_admin))).status_code == 422

    pod = gpu_pod(a, "team-x", "trainer-0")
    token = pod_token(a, pod)
    for seq in (1, 2):
        ok(await client.post("/reports", json=report(pod, seq), headers=of("a", token)))

    webhook_b = cluster_reader(b, "webhook-b")
    snapshot_b = ok(await client.get("/admission-state", headers=of("b", webhook_b)))
    assert snapshot_b["namespaces"]["team-x"]["state"] == "exhausted"
    b_pool = ok(await client.get("/namespaces/team-x/pool", headers=of("b", webhook_b)))
    assert (b_pool["name"], b_pool["used_gpu_minutes"]) == ("shared", 10.0)


async def test_a_member_admin_writes_no_pool(
    apiserver: KubeApiServer, members: dict[str, KubeApiServer], client: httpx.AsyncClient
):
    """A pool's name is one across the fleet and its members may be any cluster's: the hub's admins'."""
    admin_a = cluster_admin(members["a"], "admin-a")
    own = {"budget_gpu_minutes": 8, "members": [{"namespace": "team-x"}, {"namespace": "team-y"}]}
    assert (await client.put("/pools/a-teams", json=own, headers=of("a", admin_a))).status_code == 403

    hub_admin = cluster_admin(apiserver, "hub-admin")
    shared = {"budget_gpu_minutes": 8, "members": [{"namespace": "a/team-q"}, {"namespace": "b/team-q"}]}
    ok(await client.put("/pools/shared", json=shared, headers=of(None, hub_admin)))
    lifted = {"budget_gpu_minutes": 800, "members": [{"namespace": "team-q"}]}
    assert (await client.put("/pools/shared", json=lifted, headers=of("a", admin_a))).status_code == 403
    assert (await client.delete("/pools/shared", headers=of("a", admin_a))).status_code == 403
    assert ok(await client.get("/pools/shared", headers=of(None, hub_admin)))["budget_gpu_minutes"] == 8


async def test_what_a_member_admin_writes_lifts_no_pool_across_clusters(
    apiserver: KubeApiServer, members: dict[str, KubeApiServer], client: httpx.AsyncClient
):
    """Its namespace's grants (the pool's sum, and its own cap) and its own budget count for nothing in
    the hub's pool: a's use past the cap the hub's admin set exhausts a's team-x, past the budget b's."""
    a, b = members["a"], members["b"]
    hub_admin = cluster_admin(apiserver, "hub-admin")
    shared = {
        "budget_gpu_minutes": 12,
        "members": [{"namespace": "a/team-x", "cap_gpu_minutes": 4}, {"namespace": "b/team-x"}],
    }
    ok(await client.put("/pools/shared", json=shared, headers=of(None, hub_admin)))

    admin_a = cluster_admin(a, "admin-a")
    granted = await client.post(
        "/namespaces/team-x/grants", json={"gpu_minutes": 1000, "reason": "lift"}, headers=of("a", admin_a)
    )
    assert granted.status_code == 201, granted.text  # a's namespace is its own to grant: outside the pool
    own = {"budget_gpu_minutes": 100000, "period": "daily"}
    ok(await client.put("/namespaces/team-x/budget", json=own, headers=of("a", admin_a)))
    pool = ok(await client.get("/pools/shared", headers=of(None, hub_admin)))
    assert (pool["granted_gpu_minutes"], pool["remaining_gpu_minutes"], pool["period"]["kind"]) == (
        0.0,
        12.0,
        "monthly",
    )

    pod = gpu_pod(a, "team-x", "trainer-0")
    charged = ok(
        await client.post("/reports", json=report(pod, 1, minutes=5), headers=of("a", pod_token(a, pod)))
    )
    assert charged["state"] == "exhausted"  # past its cap of 4: the grant of 1000 did not raise it
    webhook_b = cluster_reader(b, "webhook-b")
    assert (
        ok(await client.get("/admission-state", headers=of("b", webhook_b)))["namespaces"]["team-x"]["state"]
        == "in_budget"
    )
    ok(await client.post("/reports", json=report(pod, 2, minutes=8), headers=of("a", pod_token(a, pod))))
    snapshot_b = ok(await client.get("/admission-state", headers=of("b", webhook_b)))
    assert snapshot_b["namespaces"]["team-x"]["state"] == "exhausted"  # 13 of the hub's 12, grants or not
    # The audit log tells a's admin from the hub's: each entry names the cluster that authenticated it.
    audit = ok(await client.get("/audit", headers=of(None, hub_admin)))
    assert [(e["action"], e["actor"], e["actor_cluster"]) for e in reversed(audit)] == [
        ("pool.put", "hub-admin", None),
        ("grant.create", "admin-a", "a"),
        ("budget.put", "admin-a", "a"),
    ]


async def test_a_pool_reader_of_one_cluster_sees_its_totals_and_no_other_clusters_members(
    apiserver: KubeApiServer, members: dict[str, KubeApiServer], client: httpx.AsyncClient
):
    a, b = members["a"], members["b"]
    hub_admin = cluster_admin(apiserver, "hub-admin")
    shared = {
        "budget_gpu_minutes": 20,
        "members": [{"namespace": "a/team-x"}, {"namespace": "b/team-x"}, {"namespace": "b/team-y"}],
    }
    ok(await client.put("/pools/shared", json=shared, headers=of(None, hub_admin)))
    pod = gpu_pod(a, "team-x", "trainer-0")
    ok(await client.post("/reports", json=report(pod, 1, minutes=5), headers=of("a", pod_token(a, pod))))

    bob = b.add_user("bob")
    bind_namespace_viewer(b, "team-x", "bob")
    reads = [
        ok(await client.get("/namespaces/team-x/pool", headers=of("b", bob))),
        ok(await client.get("/pools/shared", headers=of("b", bob))),
        *ok(await client.get("/pools", headers=of("b", bob))),
        ok(await client.get("/pools/shared", headers=of("b", cluster_reader(b, "ops-b")))),
    ]
    for seen in reads:
        assert (seen["used_gpu_minutes"], seen["remaining_gpu_minutes"]) == (5.0, 15.0)  # the pool's
        assert [member["namespace"] for member in seen["members"]] == ["b/team-x", "b/team-y"]
    fleet = ok(await client.get("/pools/shared", headers=of(None, cluster_reader(apiserver, "ops"))))
    assert [(m["namespace"], m["used_gpu_minutes"]) for m in fleet["members"]] == [
        ("a/team-x", 5.0),
        ("b/team-x", 0.0),
        ("b/team-y", 0.0),
    ]


@pytest.mark.parametrize("settings_update", [{"metrics_auth": "token"}])
async def test_the_fleets_metrics_are_the_hubs_to_scrape(
    apiserver: KubeApiServer, members: dict[str, KubeApiServer], client: httpx.AsyncClient
):
    """The scrape shows every cluster's namespaces: a member's cluster-wide reader is refused it."""
    assert (
        await client.get("/metrics", headers=of("a", cluster_reader(members["a"], "prom")))
    ).status_code == 403
    assert (
        await client.get("/metrics", headers=of(None, cluster_reader(apiserver, "prom")))
    ).status_code == 200


def timekeeper_kubeconfig(server: KubeApiServer, path: Path) -> Member:
    """A member entry for `server`, as its own kubeconfig with the timekeeper's ServiceAccount token."""
    token = server.add_service_account_token(TIMEKEEPER_NAMESPACE, TIMEKEEPER_SERVICE_ACCOUNT)
    return Member(kubeconfig=server.write_kubeconfig(path, token))


async def test_one_api_server_under_two_names_is_refused_naming_both(
    apiserver: KubeApiServer, members: dict[str, KubeApiServer], settings: Settings, tmp_path: Path
):
    """Member `a` is the hub's own cluster, and `b` and `c` are one API server, each through a kubeconfig
    of its own (other tokens): each of those members is refused (503) naming the other; the hub's own
    cluster is served, and so is a member that is no other (`d`)."""
    d = KubeApiServer().start().with_identity()
    install_cluster_roles(d)
    entries = {"a": apiserver, "b": members["b"], "c": members["b"], "d": d}
    configs = {name: timekeeper_kubeconfig(server, tmp_path / name) for name, server in entries.items()}
    access = await build_access_control(settings.model_copy(update={"members": configs}))
    try:
        for cluster, other in (
            ("a", "the hub's own cluster"),
            ("b", "member cluster c"),
            ("c", "member cluster b"),
        ):
            with pytest.raises(TimekeeperError) as refused:
                await access.authenticate(entries[cluster].add_user("alice"), cluster)
            assert refused.value.status_code == 503
            assert f"member cluster {cluster} is the same cluster as {other}" in refused.value.message
        local = await access.authenticate(apiserver.add_user("alice"), None)
        member = await access.authenticate(d.add_user("alice"), "d")
        assert (local and local.cluster, member and member.cluster) == (None, "d")
    finally:
        await access.aclose()
        d.stop()


async def test_a_member_whose_api_server_is_down_is_a_503_naming_it(
    apiserver: KubeApiServer, members: dict[str, KubeApiServer], client: httpx.AsyncClient
):
    """b's API server stops after the hub started: its callers' tokens cannot be reviewed. The caller is
    not wrong (no 401) and nothing broke here (no 500): a 503 that names b, with Retry-After; a's served."""
    b = members["b"]
    reader, pod = cluster_reader(b, "ops-b"), gpu_pod(b, "team-x", "trainer-0")
    token = pod_token(b, pod)
    b.stop()

    answers = [
        await client.get("/namespaces/team-x/budget", headers=of("b", reader)),
        await client.post("/reports", json=report(pod), headers=of("b", token)),
    ]

    for answer in answers:
        assert answer.status_code == 503, answer.text
        assert "member cluster b" in answer.json()["detail"]
        assert answer.headers["retry-after"] == str(RETRY_AFTER_SECONDS)
    a_reader = cluster_reader(members["a"], "ops-a")
    assert (await client.get("/namespaces/team-x/budget", headers=of("a", a_reader))).status_code == 200


async def test_a_member_down_when_the_hub_starts_keeps_no_other_cluster_from_being_served(
    apiserver: KubeApiServer, members: dict[str, KubeApiServer], settings: Settings, tmp_path: Path
):
    """b's kubeconfig points at a closed port: the hub builds its access control all the same (b's
    identity is read at b's first request), b's callers get a 503 that names b, a's are served."""
    closed = KubeApiServer().start()
    configs = dict(settings.members) | {"b": timekeeper_kubeconfig(closed, tmp_path / "b")}
    closed.stop()
    access = await build_access_control(settings.model_copy(update={"members": configs}))
    try:
        with pytest.raises(TimekeeperError) as refused:
            await access.authenticate("any-token", "b")
        assert refused.value.status_code == 503 and "member cluster b" in refused.value.message
        assert refused.value.headers == {"Retry-After": str(RETRY_AFTER_SECONDS)}
        principal = await access.authenticate(members["a"].add_user("alice"), "a")
        assert principal is not None and principal.cluster == "a"
    finally:
        await access.aclose()


@pytest.mark.parametrize("body", [b"not json", b"[]", b'{"metadata": []}', b'{"metadata": {"uid": 7}}'])
async def test_a_member_answering_garbage_for_its_identity_is_refused_and_stops_nothing_else(
    apiserver: KubeApiServer, members: dict[str, KubeApiServer], settings: Settings, body: bytes
):
    """What a member's API server answers is its admin's to choose: a body that is no namespace, where the
    hub reads the cluster's identity, neither keeps the hub from starting nor serves that member."""
    members["b"].raw_answers["/api/v1/namespaces/kube-system"] = body
    access = await build_access_control(settings)
    try:
        with pytest.raises(TimekeeperError) as refused:
            await access.authenticate(members["b"].add_user("bob"), "b")
        assert refused.value.status_code == 503 and "member cluster b" in refused.value.message
        principal = await access.authenticate(members["a"].add_user("alice"), "a")
        assert principal is not None and principal.cluster == "a"
    finally:
        await access.aclose()
