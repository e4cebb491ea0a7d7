"""`python -m timekeeper --host 0.0.0.0 --port 8080`: serve the API with uvicorn."""

from __future__ import annotations

import argparse

import uvicorn

from gpuaccounting.logs import configure_logging
from timekeeper.app import create_app
from timekeeper.settings import get_settings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m timekeeper", description="Serve the GPU Timekeeper API.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    uvicorn.run(
        create_app(settings),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        log_config=None,
        proxy_headers=True,
    )


if __name__ == "__main__":
    main()
