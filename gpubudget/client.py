"""The v1 API over httpx, every refusal turned into a sentence that says what to do."""

from __future__ import annotations

import ssl
from typing import Any

import certifi
import httpx

from gpuaccounting.names import API_PREFIX
from gpubudget.connection import ENV_TOKEN, ENV_URL, Target
from gpubudget.errors import CliError
from httpguard.nesting import deeper_than

_TOKEN_HINT = (
    f"give one with --token, --token-file or {ENV_TOKEN} (static mode: a token whose SHA-256 the "
    "timekeeper is configured with; in a cluster: a Kubernetes token, e.g. `kubectl create token "
    "<serviceaccount> -n <namespace>`)"
)
# What reading an answer as JSON raises for one that is not: RecursionError for JSON nested deeper than the
# standard parser's stack, where the stack is shallower than the nesting.
_NOT_JSON = (ValueError, RecursionError)
# No timekeeper answer nests more than a few levels; a deeper one comes from another server.
MAX_ANSWER_DEPTH = 32
_RBAC_HINT = (
    "reading a namespace needs `get gpubudgets` (group gpu-timekeeper.io) in it, which the built-in view, "
    "edit and admin roles include; listing every namespace needs `list gpubudgets` cluster-wide; budgets, "
    "grants, defaults and the audit log need the gpu-timekeeper-admin ClusterRole (static mode: an admin "
    "token)"
)


class Api:
    def __init__(self, target: Target, timeout: float) -> None:
        self.target = target
        try:
            tls = _tls(target)
        except (OSError, ssl.SSLError) as error:
            raise CliError(f"cannot load the TLS files for {target.description}: {error}", 2) from None
        self.http = httpx.Client(
            base_url=target.base_url + API_PREFIX, headers=target.headers, verify=tls, timeout=timeout
        )

    def close(self) -> None:
        self.http.close()

    def get(self, path: str, params: dict[str, Any] | None = None) -> Any:
        return self._send("GET", path, params={k: v for k, v in (params or {}).items() if v is not None})

    def put(self, path: str, body: dict[str, Any]) -> Any:
        return self._send("PUT", path, json=body)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self._send("POST", path, json=body)

    def delete(self, path: str) -> Any:
        return self._send("DELETE", path)

    def _send(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.TimeoutException:
            raise CliError(f"the timekeeper ({self.target.description}) did not answer in time") from None
        except httpx.TransportError as error:
            raise CliError(self._unreachable(error)) from None
        if response.is_success:
            try:
                document = response.json()
                if not deeper_than(document, MAX_ANSWER_DEPTH):
                    return document
            except _NOT_JSON:
                pass
            raise CliError(
                f"{method} {path} answered {response.status_code} with something other than JSON: is "
                f"{self.target.description} a GPU Timekeeper?"
            )
        raise CliError(self._refusal(method, path, response))

    def _unreachable(self, error: httpx.TransportError) -> str:
        reason = str(error) or type(error).__name__
        if self.target.through_api_server:
            return (
                f"cannot reach the API server of your kubeconfig ({self.target.description}): {reason}. "
                f"Check `kubectl version`, or give the timekeeper's URL with --url or {ENV_URL}"
            )
        return (
            f"cannot reach the timekeeper at {self.target.description}: {reason}. Is it running, and is the "
            f"URL (--url or {ENV_URL}) right? From outside the cluster, `kubectl -n gpu-timekeeper "
            "port-forward svc/gpu-timekeeper 8080:8080` and --url http://localhost:8080, or leave the URL "
            "unset to go through the API server"
        )

    def _refusal(self, method: str, path: str, response: httpx.Response) -> str:
        try:
            body = response.json()
        except _NOT_JSON:
            body = None
        status = response.status_code
        if self.target.through_api_server and isinstance(body, dict) and body.get("kind") == "Status":
            return self._api_server_refusal(status, str(body.get("message", "")))
        detail = _detail(body) if isinstance(body, dict) else response.text.strip()[:300]
        if status == 401:
            if not self.target.has_token and self.target.through_api_server:
                return (
                    "the timekeeper needs a token, and your kubeconfig's user has none to pass on (a client "
                    "certificate authenticates you to the API server only, which forwards no credential): "
                    + _TOKEN_HINT
                )
            if not self.target.has_token:
                return f"the timekeeper needs a token and none was given: {_TOKEN_HINT}"
            return f"the timekeeper did not accept the token ({detail}): {_TOKEN_HINT}"
        if status == 403:
            return f"not allowed: {detail}. {_RBAC_HINT}"
        return f"{method} {path} refused ({status}): {detail}"

    def _api_server_refusal(self, status: int, message: str) -> str:
        where = self.target.description
        if status == 401:
            return (
                f"the API server did not accept your kubeconfig's credentials ({message}): log in again; "
                "`kubectl get --raw /version` checks them"
            )
        if status == 403:
            return (
                f"the API server refused to forward to the timekeeper ({message}). Reaching it through "
                "the API server needs `get` (reads) and `create`, `update`, `delete` (changes) on "
                "`services/proxy` of the timekeeper's Service (docs/cli.md); or give its URL with --url"
            )
        if status == 404:
            return (
                f"no timekeeper Service at {where} ({message}): name it with --service "
                "NAMESPACE/NAME[:PORT] or GPU_BUDGET_SERVICE"
            )
        if status in (502, 503):
            return (
                f"the API server could not reach the timekeeper behind {where} ({message}): are its pods "
                "running and ready?"
            )
        return f"the API server answered {status}: {message}"


def _tls(target: Target) -> ssl.SSLContext | bool:
    """One SSL context with the CA and the client certificate (httpx's `verify=<path>` would drop `cert`)."""
    if target.verify is False:
        return False
    context = (
        ssl.create_default_context(cafile=target.verify)
        if isinstance(target.verify, str)
        else ssl.create_default_context(cafile=certifi.where())
    )
    if target.cert is not None:
        context.load_cert_chain(*target.cert)
    return context


def _detail(body: dict[str, Any]) -> str:
    """The timekeeper's `{"detail": ...}`: a sentence, or pydantic's list of what was wrong."""
    detail = body.get("detail", body)
    if isinstance(detail, list):
        return "; ".join(
            f"{'.'.join(str(part) for part in item.get('loc', [])[1:]) or 'request'}: {item.get('msg')}"
            for item in detail
            if isinstance(item, dict)
        )
    return str(detail)
