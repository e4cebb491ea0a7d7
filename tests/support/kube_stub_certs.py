"""A stand-in kube-apiserver for the endpoints the webhook certificate bootstrap uses.

A real HTTP server on 127.0.0.1 speaking Kubernetes JSON (objects with resourceVersion, `Status` errors
with 404 NotFound / 409 AlreadyExists / 409 Conflict / 422 Invalid), so tests drive it through the
official `kubernetes` client unchanged. It covers Secrets (get, create, replace with optimistic
concurrency), Mutating/ValidatingWebhookConfigurations (get, JSON patch) and Deployments (get, merge
patch — for maps, as `kubectl rollout restart` sends, strategic merge equals RFC 7386). Every request is
recorded so a test can assert that an idempotent run wrote nothing.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonpatch

ADMISSION = "/apis/admissionregistration.k8s.io/v1"
ROUTES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/secrets(?:/(?P<name>[^/]+))?$"), "Secret"),
    (
        re.compile(rf"^{ADMISSION}/mutatingwebhookconfigurations/(?P<name>[^/]+)$"),
        "MutatingWebhookConfiguration",
    ),
    (
        re.compile(rf"^{ADMISSION}/validatingwebhookconfigurations/(?P<name>[^/]+)$"),
        "ValidatingWebhookConfiguration",
    ),
    (re.compile(r"^/apis/apps/v1/namespaces/(?P<ns>[^/]+)/deployments/(?P<name>[^/]+)$"), "Deployment"),
]
API_VERSIONS = {
    "Secret": "v1",
    "MutatingWebhookConfiguration": "admissionregistration.k8s.io/v1",
    "ValidatingWebhookConfiguration": "admissionregistration.k8s.io/v1",
    "Deployment": "apps/v1",
}


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }


@dataclass
class FakeCluster:
    """The objects, keyed by (kind, namespace or "", name), and the log of requests received."""

    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    requests: list[tuple[str, str]] = field(default_factory=list)
    _versions: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Store an object as the API server would: apiVersion, uid and a fresh resourceVersion."""
        obj = copy.deepcopy(obj)
        kind, meta = obj["kind"], obj.setdefault("metadata", {})
        obj["apiVersion"] = API_VERSIONS[kind]
        meta["resourceVersion"] = str(next(self._versions))
        meta.setdefault("uid", f"uid-{meta['resourceVersion']}")
        meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        self.objects[(kind, meta.get("namespace", ""), meta["name"])] = obj
        return copy.deepcopy(obj)

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        try:
            return copy.deepcopy(self.objects[(kind, namespace, name)])
        except KeyError:
            raise ApiError(404, "NotFound", f'{kind.lower()}s "{name}" not found') from None

    def writes(self) -> list[tuple[str, str]]:
        return [(method, path) for method, path in self.requests if method != "GET"]

    def handle(self, method: str, path: str, content_type: str, body: Any) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.requests.append((method, path))
            for pattern, kind in ROUTES:
                if match := pattern.match(path):
                    return self._dispatch(method, kind, match.groupdict(), content_type, body)
            raise ApiError(404, "NotFound", f"no route for {path}")

    def _dispatch(
        self, method: str, kind: str, params: dict[str, str | None], content_type: str, body: Any
    ) -> tuple[int, dict[str, Any]]:
        namespace, name = params.get("ns") or "", params.get("name")
        if isinstance(body, dict):
            body["kind"] = kind  # the API server takes the kind from the URL when the body omits it
        if method == "POST" and kind == "Secret" and name is None:
            body.setdefault("metadata", {})["namespace"] = namespace
            if (kind, namespace, body["metadata"]["name"]) in self.objects:
                raise ApiError(409, "AlreadyExists", f'secrets "{body["metadata"]["name"]}" already exists')
            body["metadata"].pop("resourceVersion", None)
            return 201, self.put(body)
        if name is None:
            raise ApiError(405, "MethodNotAllowed", f"{method} on a collection")
        current = self.get(kind, namespace, name)
        if method == "GET":
            return 200, current
        if method == "PUT" and kind == "Secret":
            sent = body.get("metadata", {}).get("resourceVersion")
            if sent != current["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", "the object has been modified; please apply your changes")
            body["metadata"].update(namespace=namespace, uid=current["metadata"]["uid"])
            return 200, self.put(body)
        if method == "PATCH":
            return 200, self.put(self._patched(current, content_type, body))
        raise ApiError(405, "MethodNotAllowed", f"{method} {kind}")

    @staticmethod
    def _patched(current: dict[str, Any], content_type: str, body: Any) -> dict[str, Any]:
        if content_type == "application/json-patch+json":
            try:
                return jsonpatch.apply_patch(current, body)
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as error:
                raise ApiError(422, "Invalid", str(error)) from None
        if content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            return _merge(current, body)
        raise ApiError(415, "UnsupportedMediaType", content_type)


def _merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = _merge(merged.get(key), value)
    return merged


def _handler(cluster: FakeCluster) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            path = self.path.split("?", 1)[0]
            content_type = (self.headers.get("Content-Type") or "").split(";")[0]
            try:
                code, payload = cluster.handle(self.command, path, content_type, body)
            except ApiError as error:
                code, payload = error.code, error.status()
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = _serve

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: the cluster's request log is what tests read."""

    return Handler


def write_kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig pointing the official client at the stand-in (plain HTTP, a dummy token)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "stub", "cluster": {"server": server}}],
        "users": [{"name": "stub", "user": {"token": "stub-token"}}],
        "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "stub"}}],
        "current-context": "stub",
    }
    path.write_text(json.dumps(config))
    return path


@contextmanager
def running_cluster() -> Iterator[tuple[FakeCluster, str]]:
    """Serve a FakeCluster on an ephemeral loopback port; yields it and its base URL."""
    cluster = FakeCluster()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(cluster))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield cluster, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
