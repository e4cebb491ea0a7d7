"""The shared core of the Kubernetes boundary: one ApiClient (its HTTP session) and the API groups over
it, the mapping of the client's failures to KubeError, the reading of unparsed JSON answers, and
discovery of the versions the API server serves. The verbs build on it: reads.py, watches.py,
writes.py and reviews.py."""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, TypeVar

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError
from kubernetes_asyncio import client
from kubernetes_asyncio.client import rest
from kubernetes_asyncio.client.exceptions import ApiException

from timekeeper.kube.types import JSON, KubeApiError, KubeError, KubeUnavailableError

T = TypeVar("T")

COMPONENT = "gpu-timekeeper"
QUOTA_NAME = "gpu-timekeeper"  # the ResourceQuota we manage in each limited namespace
HTTP_GONE = 410
HTTP_NOT_FOUND = 404
HTTP_CONFLICT = 409
HTTP_TOO_MANY_REQUESTS = 429
DRA_GROUP = "resource.k8s.io"
DRA_VERSIONS = ("v1", "v1beta2", "v1beta1")  # the newest the API server serves is read


# Failures of the transport, a timeout, or an answer the HTTP parser refuses (a watch line past its bound):
# the API server is not usable now.
TRANSPORT_ERRORS = (aiohttp.ClientError, HttpProcessingError, TimeoutError, OSError)


@dataclass(frozen=True, slots=True)
class KubeLimits:
    """How much one API server's answers may hold (docs/kubernetes.md#what-an-api-server-may-answer): a
    member's admin decides what its server answers, and the hub reads it into memory. Past a bound, the
    call fails with KubeUnavailableError naming it."""

    response_bytes: int = 64 * 2**20  # one answer's body
    # The items of one paged list, all pages together, and its requests (a server may answer empty pages
    # forever); None: unbounded, for the hub's own API server, whose tenants its own limits bound.
    list_items: int | None = 200_000
    list_pages: int | None = 2_000


DEFAULT_LIMITS = KubeLimits()


class AnswerTooLarge(KubeUnavailableError):
    """An answer past KubeLimits.response_bytes: a list asks again for fewer items a page."""


class RedirectRefused(aiohttp.ClientError):
    """An API server answered a redirect: never legitimate for the calls the timekeeper makes, and following
    it would send the hub's request (and credentials) wherever the server says."""


async def _refuse_redirect(
    session: aiohttp.ClientSession, context: Any, params: aiohttp.TraceRequestRedirectParams
) -> None:
    params.response.close()
    raise RedirectRefused(f"the API server answered {params.response.status} redirecting to another URL")


def _no_redirects() -> aiohttp.TraceConfig:
    """aiohttp follows redirects unless each request says not to, and kubernetes_asyncio does not say: its
    session's `on_request_redirect` signal fires before a redirect is followed, and raising there stops it."""
    trace = aiohttp.TraceConfig()
    trace.on_request_redirect.append(_refuse_redirect)
    trace.freeze()
    return trace


def api_error(exc: ApiException) -> KubeError:
    # A 4xx is the server's refusal; anything else (no answer, a redirect, a 5xx) leaves it unusable now.
    if exc.status is None or not 400 <= exc.status < 500:
        return KubeUnavailableError(f"kubernetes API error {exc.status}: {exc.reason}")
    return KubeApiError(exc.status, str(exc.reason))


class KubeCore:
    """One session to the API server, shared by every verb. Build it on the event loop."""

    def __init__(
        self,
        configuration: client.Configuration,
        request_timeout_seconds: float = 10.0,
        limits: KubeLimits = DEFAULT_LIMITS,
    ) -> None:
        self._api = client.ApiClient(configuration)
        # The session's own list of trace configs, read for every request (aiohttp's public property).
        self._api.rest_client.pool_manager.trace_configs.append(_no_redirects())
        self._limits = limits
        self._core = client.CoreV1Api(self._api)
        self._authn = client.AuthenticationV1Api(self._api)
        self._authz = client.AuthorizationV1Api(self._api)
        self._custom = client.CustomObjectsApi(self._api)
        self._timeout = request_timeout_seconds
        self._instance = os.environ.get("HOSTNAME", COMPONENT)
        self._eviction_api_version: str | None = None
        self._dra_version: str | None = None

    async def close(self) -> None:
        await self._api.close()

    async def _call(self, call: Awaitable[T]) -> T:
        """Await a client call, turning its failures into KubeApiError (4xx) or KubeUnavailableError
        (transport failures, timeouts and 5xx: worth retrying later)."""
        try:
            return await call
        except ApiException as exc:
            raise api_error(exc) from exc
        except TRANSPORT_ERRORS as exc:
            raise KubeUnavailableError(f"kubernetes API unreachable: {exc!r}") from exc

    async def _read(self, call: Awaitable[Any]) -> rest.RESTResponse:
        """The answer of a call made with `_preload_content=False` (which answers the aiohttp response
        itself), its body read no further than KubeLimits.response_bytes, as the client would have read it
        whole; not a 2xx is KubeApiError or KubeUnavailableError, as from _call."""
        response: aiohttp.ClientResponse = await self._call(call)
        bound = self._limits.response_bytes
        async with response:
            chunks: list[bytes] = []
            size = 0
            while size <= bound and (response.content_length or 0) <= bound:
                chunk = await self._call(response.content.read(bound + 1 - size))
                if chunk:
                    chunks.append(chunk)
                    size += len(chunk)
                    continue
                answer = rest.RESTResponse(response, b"".join(chunks))
                if not 200 <= answer.status < 300:
                    raise api_error(
                        ApiException(status=answer.status, reason=answer.data.decode(errors="replace"))
                    )
                return answer
        raise AnswerTooLarge(f"kubernetes API answered more than {bound} bytes (the response_bytes bound)")

    async def _typed(self, call: Awaitable[Any], response_type: str) -> Any:
        """A call's answer (as _read's) as the client's model `response_type`; one that is not (the models
        refuse a missing required field with ValueError) is KubeUnavailableError, never an error of ours:
        a member's API server answers what its admin makes it answer."""
        answer = await self._read(call)
        try:
            return self._api.deserialize(answer, response_type)
        except (ValueError, TypeError, AttributeError, KeyError) as exc:
            raise KubeUnavailableError(f"kubernetes API answered no {response_type}: {exc}") from exc

    async def _raw_json(self, call: Awaitable[Any], exact: bool = False) -> JSON:
        """A call's answer (as _read's) as JSON; `exact`: fractions as Decimal, as the API server wrote
        them."""
        body = (await self._read(call)).data
        try:
            parsed: JSON = json.loads(body, parse_float=Decimal) if exact else json.loads(body)
        except ValueError as exc:  # a member's API server answers what its admin makes it answer
            raise KubeUnavailableError(f"kubernetes API answered a body that is not JSON: {exc}") from exc
        return parsed

    # ---- discovery: what the API server serves, asked once ---------------------------------------------

    async def eviction_api_version(self) -> str:
        """`policy/v1` where the API server serves it (1.22 on), else `policy/v1beta1` (1.20, 1.21): the
        Eviction body must name a version the server knows. Asked once (discovery), then remembered."""
        if self._eviction_api_version is None:
            group = await self._typed(
                client.PolicyApi(self._api).get_api_group(
                    _preload_content=False, _request_timeout=self._timeout
                ),
                "V1APIGroup",
            )
            served = {version.version for version in group.versions or ()}
            self._eviction_api_version = "policy/v1" if "v1" in served else "policy/v1beta1"
        return self._eviction_api_version

    async def dra_version(self) -> str | None:
        """The newest resource.k8s.io version the API server serves (v1 from 1.34, v1beta2 or v1beta1 on
        1.32-1.33), found by discovery and remembered; None where the group is not served (asked again
        next time, as a cluster may be upgraded)."""
        if self._dra_version is None:
            try:
                group = await self._typed(
                    client.ResourceApi(self._api).get_api_group(
                        _preload_content=False, _request_timeout=self._timeout
                    ),
                    "V1APIGroup",
                )
            except KubeApiError as error:
                if error.status == HTTP_NOT_FOUND:
                    return None
                raise
            served = {version.version for version in group.versions or ()}
            self._dra_version = next((v for v in DRA_VERSIONS if v in served), None)
        return self._dra_version
