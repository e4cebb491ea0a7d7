"""Use charged under a member cluster's namespace key (`a/team-x`), for the tests of what outputs say about
clusters. Such a key never comes through a report's body (its namespace is a bare name, and the hub
composes the key from the cluster that authenticated the sender), so these tests hand the report, keyed,
to the app's own ingest batcher: the path every report takes after its route, with the same charge."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from tests.support.timekeeper import report_body
from timekeeper.app import current
from timekeeper.domain.clusters import split_key
from timekeeper.usage.router import INGEST, keyed
from timekeeper.usage.schemas import ReportIn
from timekeeper.usage.service import IngestOutcome


async def charge(app: FastAPI, key: str, **fields: Any) -> IngestOutcome:
    """A report of the bare namespace of `key` (report_body's fields), validated as a sidecar's is, then
    charged under `key` (and its pod under its cluster's pod key) by the app's batcher."""
    cluster, namespace = split_key(key)
    report = ReportIn.model_validate(report_body(namespace=namespace, **fields))
    return await current(app)[INGEST].submit(keyed(cluster, report))
