"""The database baseline: a bare INSERT + COMMIT loop from concurrent connections, no HTTP, no ORM.

It is the ceiling for "acknowledged after commit" on this machine: each report needs at least one commit.
"""

from __future__ import annotations

import threading
import time

import psycopg


def insert_commit_rate(dsn: str, *, connections: int = 16, seconds: float = 5.0) -> float:
    """Commits per second of single-row INSERT transactions from `connections` concurrent clients."""
    with psycopg.connect(dsn, autocommit=True) as setup:
        setup.execute("DROP TABLE IF EXISTS bench_baseline")
        setup.execute(
            "CREATE TABLE bench_baseline (id bigserial PRIMARY KEY, pod_uid text, seq int, minutes numeric)"
        )
    counts = [0] * connections
    stop = time.monotonic() + seconds

    def worker(index: int) -> None:
        with psycopg.connect(dsn) as connection:
            while time.monotonic() < stop:
                connection.execute(
                    "INSERT INTO bench_baseline (pod_uid, seq, minutes) VALUES (%s, %s, %s)",
                    (f"pod-{index}", counts[index], 0.25),
                    prepare=True,
                )
                connection.commit()
                counts[index] += 1

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(connections)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    with psycopg.connect(dsn, autocommit=True) as cleanup:
        cleanup.execute("DROP TABLE bench_baseline")
    return sum(counts) / elapsed
