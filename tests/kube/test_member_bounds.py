"""What a member's API server may answer (docs/fleet.md#what-a-members-api-server-may-answer), on the
stand-in API server made hostile: answers past their bounds, lists that never end, redirects, watch lines
too long, reviews answered slowly, and a pass that never ends. Each fails that member's call, as
KubeUnavailableError naming the bound or a 503 naming the member, and holds nothing of the hub's."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import aclosing
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

from gpuaccounting.backoff import Backoff
from tests.kube.factories import gpu_pod
from tests.support.kube_apiserver import TOKEN_REVIEW_PATH, KubeApiServer
from tests.support.kube_rbac import TIMEKEEPER_NAMESPACE, TIMEKEEPER_SERVICE_ACCOUNT, install_cluster_roles
from tests.support.loopback import LoopbackServer
from tests.support.postgres import url_string
from tests.support.processes import wait_until
from tests.timekeeper.conftest import START
from timekeeper.auth.kubernetes import RETRY_AFTER_SECONDS, FleetAccessControl, build_access_control
from timekeeper.clock import ManualClock
from timekeeper.errors import TimekeeperError
from timekeeper.kube import KubeClient, KubeConfig, KubeUnavailableError
from timekeeper.kube.client import kube_limits
from timekeeper.kube.core import KubeLimits
from timekeeper.periodic.jobs import reconcile_job, run_job
from timekeeper.settings import Member, Settings

pytestmark = pytest.mark.asyncio(loop_scope="session")

NAMESPACES_PATH = "/api/v1/namespaces"


def client_of(server: KubeApiServer, limits: KubeLimits) -> KubeClient:
    token = server.add_service_account_token(TIMEKEEPER_NAMESPACE, TIMEKEEPER_SERVICE_ACCOUNT)
    return KubeClient(server.asyncio_configuration(token), 5, limits)


async def test_a_list_that_pages_forever_fails_at_its_page_bound(apiserver: KubeApiServer):
    apiserver.raw_answers[NAMESPACES_PATH] = json.dumps(
        {"items": [], "metadata": {"continue": "more"}}
    ).encode()
    kube = client_of(apiserver, KubeLimits(list_pages=5))
    try:
        with pytest.raises(KubeUnavailableError, match="more than 5 pages"):
            await kube.namespace_labels()
    finally:
        await kube.close()


async def test_a_list_past_its_item_bound_fails_and_one_within_it_is_read(apiserver: KubeApiServer):
    for i in range(5):
        gpu_pod(apiserver, "team-a", f"p{i}")
    bounded, roomy = (
        client_of(apiserver, KubeLimits(list_items=4)),
        client_of(apiserver, KubeLimits(list_items=5)),
    )
    try:
        with pytest.raises(KubeUnavailableError, match="more than 4 items"):
            await bounded.list_pods(page_size=2)
        assert len((await roomy.list_pods(page_size=2)).pods) == 5
    finally:
        await bounded.close()
        await roomy.close()


async def test_a_page_past_the_byte_bound_is_asked_again_smaller_and_one_object_past_it_fails(
    apiserver: KubeApiServer,
):
    """A tenant's few large pods (a Pending pod is enough) fail no list: the page is asked again with
    half the items, down to one; only an object past the bound on its own fails it."""
    for i in range(5):
        pod = gpu_pod(apiserver, "team-a", f"p{i}")
        pod["metadata"].setdefault("annotations", {})["pad"] = "x" * 30_000
        apiserver.put(pod)
    kube = client_of(apiserver, KubeLimits(response_bytes=80_000))
    try:
        listed = await kube.list_pods()
        assert sorted(p.name for p in listed.pods) == [f"p{i}" for i in range(5)]
        huge = gpu_pod(apiserver, "team-a", "huge")
        huge["metadata"].setdefault("annotations", {})["pad"] = "x" * 90_000
        apiserver.put(huge)
        with pytest.raises(KubeUnavailableError, match="response_bytes"):
            await kube.list_pods()
    finally:
        await kube.close()


def test_the_hubs_own_api_server_has_no_list_bounds_a_members_has(settings: Settings, tmp_path: Path):
    """The hub's own cluster's lists are as long as its tenants can make them: a bound there would let
    one tenant fail every pass of that cluster; a member's admin is bounded."""
    own = KubeConfig.from_settings(settings).limits
    assert (own.list_items, own.list_pages, own.response_bytes) == (
        None,
        None,
        settings.kube_max_response_bytes,
    )
    assert kube_limits(settings).list_items == settings.kube_max_list_items


async def test_an_answer_past_its_byte_bound_fails_naming_it(apiserver: KubeApiServer):
    apiserver.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}})
    padding = " " * 2**20  # a valid namespace, padded past the bound: JSON allows the spaces
    body = json.dumps({"metadata": {"uid": "u", "name": "kube-system"}}).encode()
    apiserver.raw_answers["/api/v1/namespaces/kube-system"] = body[:-1] + padding.encode() + b"}"
    bounded, roomy = (
        client_of(apiserver, KubeLimits(response_bytes=2**20)),
        client_of(apiserver, KubeLimits()),
    )
    try:
        with pytest.raises(KubeUnavailableError, match="response_bytes"):
            await bounded.cluster_id()
        assert await roomy.cluster_id() == "u"
    finally:
        await bounded.close()
        await roomy.close()


class _Seen(BaseHTTPRequestHandler):
    """A host on the hub's network: records every request that reaches it."""

    paths: list[str] = []

    def _record(self) -> None:
        self.paths.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = _record

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def internal_host() -> Iterator[tuple[str, list[str]]]:
    seen: list[str] = []
    server = LoopbackServer(type("Seen", (_Seen,), {"paths": seen})).start()
    yield server.url, seen
    server.stop()


async def test_a_redirect_is_never_followed(apiserver: KubeApiServer, internal_host: tuple[str, list[str]]):
    """Member b's API server answers 307 to a host on the hub's network: the hub's request stops there,
    for a review (POST) and a list (GET) alike."""
    url, seen = internal_host
    apiserver.redirects[TOKEN_REVIEW_PATH] = f"{url}/internal/admin"
    apiserver.redirects[NAMESPACES_PATH] = f"{url}/internal/metadata"
    kube = client_of(apiserver, KubeLimits())
    try:
        with pytest.raises(KubeUnavailableError, match="307"):
            await kube.token_review("a-token", ())
        with pytest.raises(KubeUnavailableError, match="307"):
            await kube.namespace_labels()
    finally:
        await kube.close()
    assert seen == []


async def test_a_watch_line_past_its_bound_is_a_failed_watch_retried(apiserver: KubeApiServer):
    """One line of 5 MiB (aiohttp reads no line past 2 x the client's 2 MiB read buffer): the watch fails,
    backs off and watches again, as for any failure; it once escaped the watch as an unexpected error."""
    path = "/apis/resource.k8s.io/v1/resourceslices"
    apiserver.raw_answers[path] = b'{"type": "ADDED", "object": {"x": "' + b"x" * 5 * 2**20 + b'"}}\n'
    kube = client_of(apiserver, KubeLimits())
    slice_ = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"}}
    try:
        changes = kube.watch_custom_raw("resource.k8s.io", "v1", "resourceslices", 5, Backoff(0.05, 0.1))
        async with aclosing(changes):
            first = asyncio.ensure_future(anext(changes))
            await asyncio.sleep(0.5)  # the long line has been answered, and refused
            del apiserver.raw_answers[path]
            apiserver.put(slice_)
            type_, raw = await asyncio.wait_for(first, 20)
    finally:
        await kube.close()
    assert (type_, raw["metadata"]["name"]) == ("ADDED", "s")


@pytest.fixture
def member(apiserver: KubeApiServer) -> Iterator[KubeApiServer]:
    apiserver.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}})
    server = KubeApiServer().start()
    install_cluster_roles(server)
    server.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system"}})
    yield server
    server.stop()


async def fleet(
    settings: Settings, member: KubeApiServer, tmp_path: Path, **update: Any
) -> FleetAccessControl:
    token = member.add_service_account_token(TIMEKEEPER_NAMESPACE, TIMEKEEPER_SERVICE_ACCOUNT)
    members = {"b": Member(kubeconfig=member.write_kubeconfig(tmp_path / "kubeconfig-b", token))}
    access = await build_access_control(settings.model_copy(update={"members": members, **update}))
    assert isinstance(access, FleetAccessControl)
    return access


async def test_a_slow_members_reviews_past_its_bound_wait_their_turn_then_are_a_503(
    settings: Settings, member: KubeApiServer, tmp_path: Path
):
    """b answers reviews in 1 s and may take 1.5 s, one at a time: the second caller waits its turn and is
    served; the third, who would wait past 1.5 s, is a 503 (never 401: the caller may be right)."""
    access = await fleet(
        settings, member, tmp_path, member_reviews_in_flight=1, member_review_timeout_seconds=1.5
    )
    alice, bob, carol = member.add_user("alice"), member.add_user("bob"), member.add_user("carol")
    member.delays[TOKEN_REVIEW_PATH] = 1.0
    try:
        first = asyncio.ensure_future(access.authenticate(alice, "b"))
        await asyncio.to_thread(wait_until, lambda: member.delayed[TOKEN_REVIEW_PATH] >= 1, 10, "a review")
        second = asyncio.ensure_future(access.authenticate(bob, "b"))
        await asyncio.sleep(0.1)
        with pytest.raises(TimekeeperError) as refused:
            await access.authenticate(carol, "b")
        assert refused.value.status_code == 503 and "member cluster b" in refused.value.message
        assert "too many reviews" in refused.value.message
        assert refused.value.headers == {"Retry-After": str(RETRY_AFTER_SECONDS)}
        served = [await first, await second]
        assert [p.name if p else None for p in served] == ["alice", "bob"]
    finally:
        await access.aclose()


async def test_a_members_review_past_its_timeout_is_a_503(
    settings: Settings, member: KubeApiServer, tmp_path: Path
):
    access = await fleet(settings, member, tmp_path, member_review_timeout_seconds=0.2)
    member.delays[TOKEN_REVIEW_PATH] = 2.0
    try:
        with pytest.raises(TimekeeperError) as refused:
            await access.authenticate(member.add_user("alice"), "b")
        assert refused.value.status_code == 503 and "member cluster b" in refused.value.message
    finally:
        await access.aclose()


class _EndlessPass:
    """A member's pass that never ends (its API server answers slowly, but forever), noting what the
    database held once it started."""

    def __init__(self, claimed: Any) -> None:
        self.claimed = claimed
        self.seen: list[int] = []

    async def wait_synced(self) -> None:
        """Synced."""

    async def run_pass(self) -> Any:
        self.seen.append(await self.claimed())
        await asyncio.Event().wait()


async def test_a_members_pass_ends_after_an_interval_holding_no_transaction(
    database_url: URL, settings: Settings
):
    """The window is claimed and committed before the pass (another connection sees the claim while it
    runs: no transaction waits on the member), the pass ends (TimeoutError) after one interval, and its
    window is given back."""
    engine = create_async_engine(url_string(database_url), poolclass=sa.NullPool)
    sessions = async_sessionmaker(engine)
    count = sa.text("SELECT count(*) FROM job_runs WHERE job = 'reconcile:b'")

    async def claimed() -> int:
        async with engine.connect() as connection:
            return int((await connection.execute(count)).scalar_one())

    endless = _EndlessPass(claimed)
    fast = settings.model_copy(update={"reconcile_interval_seconds": 0.5})
    try:
        with pytest.raises(TimeoutError):
            await run_job(reconcile_job(endless, "b"), sessions, fast, ManualClock(START), "replica")
        assert endless.seen == [1]
        assert await claimed() == 0
    finally:
        await engine.dispose()


@pytest.mark.parametrize("body", [b"not json", b"[]", b"{}", b'{"spec": {}, "status": []}'])
async def test_a_review_answered_with_garbage_is_a_503(
    settings: Settings, member: KubeApiServer, tmp_path: Path, body: bytes
):
    """A body that is no TokenReview, answered by b for a review: b cannot review now (never a 500)."""
    access = await fleet(settings, member, tmp_path)
    member.raw_answers[TOKEN_REVIEW_PATH] = body
    try:
        with pytest.raises(TimekeeperError) as refused:
            await access.authenticate(member.add_user("alice"), "b")
        assert refused.value.status_code == 503 and "member cluster b" in refused.value.message
    finally:
        await access.aclose()
