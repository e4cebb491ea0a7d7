"""`python -m timekeeper --host 0.0.0.0 --port 8080`: serve the API with uvicorn."""

from __future__ import annotations

import argparse

import uvicorn

from timekeeper.app import create_app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m timekeeper", description="Serve the GPU Timekeeper API.")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    uvicorn.run(create_app(), host=args.host, port=args.port, log_level=args.log_level, proxy_headers=True)


if __name__ == "__main__":
    main()
