"""`python -m timekeeper --host 0.0.0.0 --port 8080`: serve the API with uvicorn. What uvicorn has no
setting for (head size and time, body time, connections) is `httpguard.connections.GuardedHttp`."""

from __future__ import annotations

import argparse
import gc
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI

from gpuaccounting.logs import configure_logging
from httpguard.connections import ConnectionLimits, GuardedHttp
from timekeeper.app import create_app
from timekeeper.metrics import count_refused_connection
from timekeeper.settings import Settings, get_settings

# The youngest generation's threshold once the start-up heap is frozen (CPython's default is 700).
YOUNG_GC_THRESHOLD = 10_000

Lifespan = Callable[[Any], AbstractAsyncContextManager[Any]]


def frozen_after_startup(lifespan: Lifespan) -> Lifespan:
    """`lifespan`, followed by `gc.freeze()` of everything start-up made and a higher threshold for the
    youngest generation, so collections walk only what was made since and run when cycles pile up
    (docs/performance.md, "Ingest: the garbage collector")."""

    @asynccontextmanager
    async def frozen(app: Any) -> AsyncIterator[Any]:
        async with lifespan(app) as state:
            gc.collect()
            gc.freeze()
            gc.set_threshold(YOUNG_GC_THRESHOLD, *gc.get_threshold()[1:])
            yield state

    return frozen


def serving_app() -> FastAPI:
    """The app factory uvicorn calls in every worker process (each configures its own logging and
    builds its own engine in the lifespan, after which its heap is frozen: `frozen_after_startup`)."""
    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    app = create_app(settings)
    app.router.lifespan_context = frozen_after_startup(app.router.lifespan_context)
    return app


def guarded_http(settings: Settings) -> GuardedHttp:
    """uvicorn's httptools protocol behind the connection limits of `settings`, counting what they refuse
    on /metrics."""
    limits = ConnectionLimits(
        max_connections=settings.max_connections,
        max_connections_per_source=settings.max_connections_per_source,
        max_head_bytes=settings.max_head_bytes,
        head_timeout_seconds=settings.head_timeout_seconds,
        body_timeout_seconds=settings.body_timeout_seconds,
    )
    return GuardedHttp(limits, "httptools", on_refused=count_refused_connection)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m timekeeper", description="Serve the GPU Timekeeper API.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    parser.add_argument("--log-level", default="info")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes sharing the port (default 1); use one per core the timekeeper may use",
    )
    parser.add_argument("--no-access-log", action="store_true", help="skip uvicorn's per-request log line")
    args = parser.parse_args(argv)
    uvicorn.run(
        "timekeeper.__main__:serving_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
        log_config=None,
        access_log=not args.no_access_log,
        proxy_headers=True,
        http=guarded_http(get_settings()),  # type: ignore[arg-type]
        ws="none",
    )


if __name__ == "__main__":
    main()
