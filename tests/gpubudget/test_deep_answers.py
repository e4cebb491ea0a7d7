"""An answer nested deeper than the standard parser's stack (a server that is not the timekeeper) is an
error that says so, exit 1, never a traceback (issue #38)."""

from __future__ import annotations

from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest

from gpubudget.commands import main
from tests.support.loopback import LoopbackServer

DEEP = b"[" * 1_000 + b"]" * 1_000


def _deep_server(status: int) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(DEEP)))
            self.end_headers()
            self.wfile.write(DEEP)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@pytest.fixture(params=[200, 500])
def deep_server(request: pytest.FixtureRequest) -> Iterator[tuple[str, int]]:
    server = LoopbackServer(_deep_server(request.param)).start()
    yield server.url, request.param
    server.stop()


def test_a_deep_answer_is_an_error_not_a_traceback(
    deep_server: tuple[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    url, status = deep_server

    code = main(["status", "--url", url, "--token", "t"])

    err = capsys.readouterr().err
    assert code == 1
    assert ("other than JSON" if status == 200 else "refused (500)") in err
