"""Who is asking: a TokenReview of the sidecar's projected token (audience `gpu-timekeeper-nodeagent`), whose
extras name the pod, so a pod reads only its own. Answers are cached briefly, keyed by the token's
hash, so a sidecar asking every second costs one review a minute."""

from __future__ import annotations

import hashlib
import json
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.client import HTTPConnection, HTTPException, HTTPSConnection
from pathlib import Path
from urllib.parse import urlsplit

from gpuaccounting.podgpus import NODEAGENT_AUDIENCE

POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"
SERVICEACCOUNT_PREFIX = "system:serviceaccount:"
CACHE_LIMIT = 4096


class ReviewFailed(Exception):
    """The API server could not be asked (network, 5xx): the caller should retry, not be refused."""


@dataclass(frozen=True, slots=True)
class PodIdentity:
    namespace: str
    pod: str
    pod_uid: str


def identity_from_review(status: dict[str, object]) -> PodIdentity | None:
    """The pod a TokenReview status authenticates, or None (not authenticated, not a pod-bound token)."""
    if not status.get("authenticated"):
        return None
    user = status.get("user")
    if not isinstance(user, dict):
        return None
    username = str(user.get("username", ""))
    extra = user.get("extra") or {}
    if not username.startswith(SERVICEACCOUNT_PREFIX) or not isinstance(extra, dict):
        return None
    namespace = username.removeprefix(SERVICEACCOUNT_PREFIX).partition(":")[0]
    names, uids = extra.get(POD_NAME_EXTRA) or [], extra.get(POD_UID_EXTRA) or []
    if not namespace or len(names) != 1 or len(uids) != 1:
        return None
    return PodIdentity(namespace, str(names[0]), str(uids[0]))


class TokenReviewer:
    """Reviews tokens with the agent's own ServiceAccount (which may create TokenReviews, nothing else)."""

    def __init__(
        self,
        url: str,
        token_file: Path,
        ca_file: Path | None,
        cache_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        parts = urlsplit(url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or "localhost"
        self._port = parts.port
        self._context = ssl.create_default_context(cafile=str(ca_file)) if self._https and ca_file else None
        self._token_file = token_file
        self._cache_seconds = cache_seconds
        self._clock = clock
        self._cache: dict[str, tuple[float, PodIdentity | None]] = {}
        self._lock = threading.Lock()

    def _post(self, body: bytes) -> dict[str, object]:
        token = self._token_file.read_text(encoding="utf-8").strip()
        connection = (
            HTTPSConnection(self._host, self._port, timeout=5, context=self._context)
            if self._https
            else HTTPConnection(self._host, self._port, timeout=5)
        )
        try:
            connection.request(
                "POST",
                "/apis/authentication.k8s.io/v1/tokenreviews",
                body=body,
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"},
            )
            response = connection.getresponse()
            payload = response.read()
        except (OSError, HTTPException) as error:
            raise ReviewFailed(f"{type(error).__name__}: {error}") from None
        finally:
            connection.close()
        if response.status != 201 and response.status != 200:
            raise ReviewFailed(f"TokenReview answered HTTP {response.status}")
        answer = json.loads(payload)
        return answer.get("status") or {}

    def review(self, token: str) -> PodIdentity | None:
        """The pod this token belongs to; None when it is not a valid pod token for our audience."""
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        with self._lock:
            cached = self._cache.get(key)
            if cached and cached[0] > now:
                return cached[1]
        body = json.dumps(
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token, "audiences": [NODEAGENT_AUDIENCE]},
            }
        ).encode()
        identity = identity_from_review(self._post(body))
        with self._lock:
            if len(self._cache) >= CACHE_LIMIT:
                self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            if len(self._cache) < CACHE_LIMIT:
                self._cache[key] = (now + self._cache_seconds, identity)
        return identity
