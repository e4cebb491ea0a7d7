"""A stand-in for the timekeeper's `GET /api/v1/admission-state`: a real HTTP server on 127.0.0.1.

It serves the snapshot format of gpuaccounting.admission_state with an ETag and answers 304 to a matching
If-None-Match, as the timekeeper does; tests change the snapshot or make it fail, and read what it was sent.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

import orjson

from gpuaccounting.admission_state import (
    AdmissionSnapshot,
    ModelPolicy,
    NamespaceAdmission,
    PriorityPolicy,
    compact,
    default_priority_policy,
)
from gpuaccounting.names import ADMISSION_STATE_PATH
from gpuaccounting.wire import BudgetState


def entry(
    state: BudgetState = "in_budget",
    max_gpu_share_per_pod: float | None = None,
    exhausted_models: list[str] | None = None,
    model_policy: ModelPolicy = "reduce",
    **policy: Any,
) -> NamespaceAdmission:
    """One namespace's entry: the cluster-default priority policy unless `policy` overrides its keys."""
    return {
        "state": state,
        "max_gpu_share_per_pod": max_gpu_share_per_pod,
        "priority_policy": cast(PriorityPolicy, {**default_priority_policy(), **policy}),
        "exhausted_models": list(exhausted_models or []),
        "model_policy": model_policy,
    }


def snapshot(
    version: int = 1,
    namespaces: dict[str, NamespaceAdmission] | None = None,
    default: NamespaceAdmission | None = None,
) -> AdmissionSnapshot:
    """The published form of these resolved entries (admission_state.compact)."""
    return compact(
        version,
        "2026-11-22T00:00:00Z",
        {"in_budget": "gpu-in-budget", "over_budget": "gpu-over-budget"},
        default or entry(),
        namespaces or {},
    )


@dataclass
class StateServer:
    url: str = ""
    state: AdmissionSnapshot | None = None
    failing: bool = False
    body_override: bytes | None = None  # serve this (e.g. garbage) instead of the snapshot
    seen: list[dict[str, str]] = field(default_factory=list)  # headers of every request received

    def publish(self, state: AdmissionSnapshot) -> None:
        self.state = state


def _handler(server: StateServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        disable_nagle_algorithm = True  # headers and body in two writes: no delayed-ACK stall

        def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
            return

        def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            server.seen.append(dict(self.headers.items()))
            if self.path != ADMISSION_STATE_PATH:
                self._send(404, b'{"detail":"not found"}')
            elif server.failing or server.state is None:
                self._send(503, b'{"detail":"unavailable"}')
            else:
                etag = f'"{server.state["version"]}"'
                if self.headers.get("If-None-Match") == etag:
                    self._send(304, headers={"ETag": etag})
                else:
                    body = server.body_override or orjson.dumps(server.state)
                    self._send(200, body, {"ETag": etag, "Content-Type": "application/json"})

    return Handler


@contextmanager
def run_state_server(state: AdmissionSnapshot | None = None) -> Iterator[StateServer]:
    served = StateServer(state=state)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(served))
    served.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
