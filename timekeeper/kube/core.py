"""The shared core of the Kubernetes boundary: one ApiClient (its HTTP session) and the API groups over
it, the mapping of the client's failures to KubeError, the reading of unparsed JSON answers, and
discovery of the versions the API server serves. The verbs build on it: reads.py, watches.py,
writes.py and reviews.py."""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable
from decimal import Decimal
from typing import Any, TypeVar

import aiohttp
from kubernetes_asyncio import client
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


def api_error(exc: ApiException) -> KubeError:
    if exc.status is None or exc.status == 0 or exc.status >= 500:
        return KubeUnavailableError(f"kubernetes API error {exc.status}: {exc.reason}")
    return KubeApiError(exc.status, str(exc.reason))


class KubeCore:
    """One session to the API server, shared by every verb. Build it on the event loop."""

    def __init__(self, configuration: client.Configuration, request_timeout_seconds: float = 10.0) -> None:
        self._api = client.ApiClient(configuration)
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
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise KubeUnavailableError(f"kubernetes API unreachable: {exc!r}") from exc

    async def _raw_json(self, call: Awaitable[Any], exact: bool = False) -> JSON:
        """The JSON body of an unparsed answer (`_preload_content=False` answers the aiohttp response
        itself, status unchecked); `exact`: fractions as Decimal, as the API server wrote them."""
        response: aiohttp.ClientResponse = await self._call(call)
        async with response:
            body = await self._call(response.read())
            if not 200 <= response.status < 300:
                raise api_error(ApiException(status=response.status, reason=body.decode(errors="replace")))
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
            group = await self._call(
                client.PolicyApi(self._api).get_api_group(_request_timeout=self._timeout)
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
                group = await self._call(
                    client.ResourceApi(self._api).get_api_group(_request_timeout=self._timeout)
                )
            except KubeApiError as error:
                if error.status == HTTP_NOT_FOUND:
                    return None
                raise
            served = {version.version for version in group.versions or ()}
            self._dra_version = next((v for v in DRA_VERSIONS if v in served), None)
        return self._dra_version
