"""What every stand-in HTTP server in the tests shares: an ephemeral 127.0.0.1 port served from a thread,
and JSON answers with a Content-Length (so keep-alive clients, like the `kubernetes` client, read them)."""

from __future__ import annotations

import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class LoopbackServer:
    """A ThreadingHTTPServer for `handler` on a free loopback port (HTTPS with `tls`); `stop()` it when
    the test is done."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], tls: ssl.SSLContext | None = None) -> None:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._scheme = "http"
        if tls is not None:
            self._httpd.socket = tls.wrap_socket(self._httpd.socket, server_side=True)
            self._scheme = "https"
        # Request threads never block stop(): an open watch or a slow client ends with the test.
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def start(self) -> LoopbackServer:
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"{self._scheme}://{host}:{port}"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def send_json(handler: BaseHTTPRequestHandler, status: int, payload: Any) -> None:
    data = json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
