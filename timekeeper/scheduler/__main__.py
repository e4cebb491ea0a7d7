"""`python -m timekeeper.scheduler`: only the periodic jobs (with TIMEKEEPER_RECONCILE, the reconcile pass
and its pod watch too), for deployments that run the API replicas with TIMEKEEPER_SCHEDULER_ENABLED=false.
Any number may run; one leads."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from prometheus_client import CollectorRegistry, start_http_server

from timekeeper.app import leader_work
from timekeeper.db.session import build_engine, build_sessionmaker, resolve_database_url
from timekeeper.periodic.runner import build_runner
from timekeeper.settings import get_settings


async def serve(metrics_port: int | None) -> None:
    settings = get_settings()
    database_url = await resolve_database_url(settings)
    engine = build_engine(database_url, pool_size=2)
    registry = CollectorRegistry()
    if metrics_port is not None:
        start_http_server(metrics_port, registry=registry)
    runner = await build_runner(
        database_url, build_sessionmaker(engine), settings, settings.clock(), registry, leader_work
    )
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    runner.start()
    try:
        await stopping.wait()
    finally:
        await runner.stop()
        await engine.dispose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m timekeeper.scheduler", description="Run the timekeeper's periodic jobs."
    )
    parser.add_argument("--metrics-port", type=int, default=None, help="serve /metrics on this port")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper())
    asyncio.run(serve(args.metrics_port))


if __name__ == "__main__":
    main()
