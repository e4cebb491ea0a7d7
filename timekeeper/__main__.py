"""`python -m timekeeper --host 0.0.0.0 --port 8080`: serve the API with uvicorn."""

from __future__ import annotations

import argparse

import uvicorn
from fastapi import FastAPI

from gpuaccounting.logs import configure_logging
from timekeeper.app import create_app
from timekeeper.settings import get_settings


def serving_app() -> FastAPI:
    """The app factory uvicorn calls in every worker process (each configures its own logging and
    builds its own engine in the lifespan)."""
    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    return create_app(settings)


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
    )


if __name__ == "__main__":
    main()
