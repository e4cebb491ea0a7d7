"""Property-based fuzzing of the whole v1 API: never a 5xx, every answer as the OpenAPI document says,
and the ledger never corrupted or double-counted.

Schemathesis generates requests for every operation from the app's own OpenAPI document and calls the real
app in-process (ASGI) with a valid token of the role the operation needs; hypothesis adds raw, malformed
report bodies and streams of well-formed reports. The app runs its own lifespan (engine, pool) on a runner
thread, so the per-test rollback fixture cannot be used: the module has a migrated database of its own.
After each run the ledger is checked against the running totals and each pod's charged time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import orjson
import pytest
import schemathesis
import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.python.asgi import shutdown_lifespans
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy.engine import URL

from gpuaccounting.names import CLUSTER_HEADER
from tests.support.postgres import url_string
from tests.support.timekeeper import Tokens, bearer, migrated_database, report_body
from tests.timekeeper.conftest import START
from timekeeper.app import create_app
from timekeeper.clock import ManualClock
from timekeeper.domain.periods import PeriodKind, period_containing
from timekeeper.settings import Settings

# Bounded for CI and reproducible: the same examples on every run.
FUZZ = settings(
    max_examples=30,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
)

# Which token each operation is called with: the least role that may call it.
ROLES = {
    ("POST", "/api/v1/reports"): "reporter",
    ("GET", "/api/v1/namespaces/{namespace}/usage"): "reader",
    ("GET", "/api/v1/namespaces"): "reader",
    ("GET", "/api/v1/namespaces/{namespace}/budget"): "reader",
    ("PUT", "/api/v1/namespaces/{namespace}/budget"): "admin",
    ("DELETE", "/api/v1/namespaces/{namespace}/budget"): "admin",
    ("GET", "/api/v1/defaults"): "admin",
    ("PUT", "/api/v1/defaults"): "admin",
    ("POST", "/api/v1/namespaces/{namespace}/grants"): "admin",
    ("GET", "/api/v1/namespaces/{namespace}/grants"): "reader",
    ("DELETE", "/api/v1/namespaces/{namespace}/grants/{grant_id}"): "admin",
    ("GET", "/api/v1/namespaces/{namespace}/budget/events"): "reader",
    ("GET", "/api/v1/namespaces/{namespace}/efficiency"): "reader",
    ("GET", "/api/v1/idle-pods"): "reader",
    ("GET", "/api/v1/pools"): "reader",
    ("GET", "/api/v1/pools/{name}"): "reader",
    ("PUT", "/api/v1/pools/{name}"): "admin",
    ("DELETE", "/api/v1/pools/{name}"): "admin",
    ("GET", "/api/v1/namespaces/{namespace}/pool"): "reader",
    ("GET", "/api/v1/audit"): "admin",
    ("GET", "/api/v1/admission-state"): "reader",
    ("GET", "/api/v1/billing/weights"): "reader",
    ("PUT", "/api/v1/billing/weights/{model}"): "admin",
    ("DELETE", "/api/v1/billing/weights/{model}"): "admin",
    ("GET", "/api/v1/billing/prices"): "reader",
    ("PUT", "/api/v1/billing/prices/{model}"): "admin",
    ("DELETE", "/api/v1/billing/prices/{model}"): "admin",
    ("GET", "/api/v1/billing/charge-basis"): "reader",
    ("GET", "/api/v1/billing/chargeback"): "reader",
    ("PUT", "/api/v1/billing/charge-basis"): "admin",
    ("DELETE", "/api/v1/billing/charge-basis"): "admin",
    ("GET", "/api/v1/namespaces/{namespace}/charge-basis"): "reader",
    ("PUT", "/api/v1/namespaces/{namespace}/charge-basis"): "admin",
    ("DELETE", "/api/v1/namespaces/{namespace}/charge-basis"): "admin",
    ("GET", "/api/v1/whoami"): "reader",
    ("GET", "/api/v1/healthz"): None,
    ("GET", "/api/v1/readyz"): None,
    ("GET", "/api/v1/metrics"): None,
}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


@pytest.fixture(scope="module")
def fuzz_database() -> Iterator[URL]:
    with migrated_database("gtk_fuzz") as url:
        yield url


def fuzz_app(database: URL, tokens: Tokens) -> FastAPI:
    """The real app on the module's database, its clock fixed so generated times are judged alike."""
    settings = Settings(
        database_url=url_string(database),
        scheduler_enabled=False,
        ledger_retention=timedelta(days=40),  # every raw row kept: the check below adds them up
        **tokens.settings(),
    )
    return create_app(settings, ManualClock(START))


@pytest.fixture(scope="module")
def api_schema(fuzz_database: URL, tokens: Tokens) -> Iterator[Any]:
    schema = schemathesis.openapi.from_asgi("/openapi.json", fuzz_app(fuzz_database, tokens))
    schema.config.generation.update(max_examples=FUZZ.max_examples)
    schema.config.seed = 20260318
    yield schema
    shutdown_lifespans()


@pytest.fixture(scope="module")
def client(fuzz_database: URL, tokens: Tokens) -> Iterator[TestClient]:
    with TestClient(fuzz_app(fuzz_database, tokens), base_url="http://timekeeper/api/v1") as client:
        yield client


LEDGER_AGAINST_TOTALS = sa.text(
    "SELECT coalesce((SELECT used_gpu_minutes FROM usage_totals WHERE namespace = :namespace "
    "AND period_kind = :kind AND period_start = :start), 0) AS total, "
    "coalesce((SELECT sum(round(l.gpu_share * ("
    "SELECT coalesce(sum(extract(epoch FROM upper(r) - lower(r))), 0) "
    "FROM unnest(l.charged * tstzmultirange(tstzrange(:start, :end))) AS r) / 60, 9)) "
    "FROM usage_ledger l WHERE l.namespace = :namespace), 0) AS ledger"
)
# A pod's charged pieces, over all its ledger rows: summed one by one they must equal their union (no time
# charged twice), and the union must be exactly the time its coverage records.
DOUBLE_COUNTED = sa.text(
    "SELECT p.pod_uid FROM pod_coverage p LEFT JOIN ("
    "SELECT pod_uid, range_agg(r) AS charged, sum(extract(epoch FROM upper(r) - lower(r))) AS seconds "
    "FROM usage_ledger, unnest(charged) AS r GROUP BY pod_uid) c USING (pod_uid) "
    "WHERE coalesce(c.charged, '{}') <> p.covered OR coalesce(c.seconds, 0) <> "
    "(SELECT coalesce(sum(extract(epoch FROM upper(r) - lower(r))), 0) FROM unnest(p.covered) AS r)"
)
# The same of the hourly aggregates (the history the answers read): their pieces make up each pod's
# coverage exactly, none twice.
DOUBLE_COUNTED_HOURS = sa.text(
    "SELECT p.pod_uid FROM pod_coverage p LEFT JOIN ("
    "SELECT pod_key, range_agg(r) AS charged, sum(extract(epoch FROM upper(r) - lower(r))) AS seconds "
    "FROM usage_pod_hours, unnest(charged) AS r GROUP BY pod_key) c ON c.pod_key = p.id "
    "WHERE coalesce(c.charged, '{}') <> p.covered OR coalesce(c.seconds, 0) <> "
    "(SELECT coalesce(sum(extract(epoch FROM upper(r) - lower(r))), 0) FROM unnest(p.covered) AS r)"
)


def assert_ledger_consistent(database: URL, client: TestClient, tokens: Tokens) -> None:
    """No corruption, no double count: each namespace's running total for its current period equals the
    ledger's charged time inside that period (share x minutes, rounded per row as charged), and no pod's
    time is charged twice."""
    engine = sa.create_engine(url_string(database), poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            namespaces = connection.scalars(sa.text("SELECT DISTINCT namespace FROM usage_ledger")).all()
            assert namespaces, "the run charged nothing, so it proves nothing"
            for namespace in namespaces:
                budget = client.get(f"/namespaces/{namespace}/budget", headers=bearer(tokens.reader)).json()
                period = period_containing(PeriodKind(budget["period"]["kind"]), START)
                row = connection.execute(
                    LEDGER_AGAINST_TOTALS,
                    {
                        "namespace": namespace,
                        "kind": period.kind.value,
                        "start": period.start,
                        "end": period.end,
                    },
                ).one()
                assert row.total == row.ledger, (namespace, period)
            assert connection.scalars(DOUBLE_COUNTED).all() == []
            assert connection.scalars(DOUBLE_COUNTED_HOURS).all() == []
    finally:
        engine.dispose()


@schemathesis.pytest.from_fixture("api_schema").parametrize()
@FUZZ
def test_every_operation_answers_as_documented_and_never_5xx(case: Any, tokens: Tokens) -> None:
    role = ROLES[(case.operation.method.upper(), case.operation.path)]
    headers = bearer(getattr(tokens, role)) if role else {}
    # The documented cluster header is left out: this app has no member clusters, so any value is the one
    # 400 (tests/timekeeper/test_auth.py), and the examples are spent on what lies behind it.
    if case.headers:
        case.headers.pop(CLUSTER_HEADER, None)
    case.call_and_validate(headers=headers, checks=CHECKS)


# --- raw report bodies -------------------------------------------------------------------------------

BASE_REPORT = report_body(start=START - timedelta(minutes=30), namespace="fuzz-raw", pod_uid="uid-fuzz-raw")
FIELDS = sorted(BASE_REPORT)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
# Literals a JSON encoder would never write but a client can send: out-of-range numbers, NaN and the
# infinities (not JSON at all), lone surrogates, deep nesting, odd unicode.
ODD_LITERALS = st.sampled_from(
    [
        "NaN",
        "Infinity",
        "-Infinity",
        "1e400",
        "-1e400",
        "1" + "0" * 4000,
        str(2**64),
        str(-(2**63) - 1),
        '"\\ud800"',
        '"\\u0000"',
        '"2026-03-18T11:30:00"',
        '"2026-03-18T11:30:00+99:00"',
        '"9999-12-31T23:59:59Z"',
        '"0001-01-01T00:00:00+14:00"',
        '"team\\u00e9"',
        '"\\u202eteam-a"',
        '"team-a\\n"',
        "[" * 20000 + "]" * 20000,
        '{"a":' * 5000 + "1" + "}" * 5000,
    ]
)


def encoded(value: Any) -> bytes:
    """JSON as a client may write it: integers of any size (orjson would refuse beyond 64 bits)."""
    return json.dumps(value).encode()


def without_field(field: str) -> bytes:
    return orjson.dumps({key: value for key, value in BASE_REPORT.items() if key != field})


def with_field(field: str, literal: str) -> bytes:
    """The valid report with one field's value replaced by raw JSON text."""
    return without_field(field)[:-1] + b',"' + field.encode() + b'":' + literal.encode() + b"}"


MALFORMED_BODIES = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=64).map(str.encode),
    JSON_VALUES.filter(lambda value: not isinstance(value, dict)).map(encoded),
    st.sampled_from(FIELDS).map(without_field),
    st.builds(with_field, st.sampled_from(FIELDS), ODD_LITERALS),
    st.builds(with_field, st.sampled_from(FIELDS), JSON_VALUES.map(lambda value: encoded(value).decode())),
)


def post_raw(client: TestClient, token: str, body: bytes) -> Any:
    return client.post("/reports", content=body, headers=bearer(token) | {"Content-Type": "application/json"})


@FUZZ
@given(body=MALFORMED_BODIES)
def test_a_malformed_or_odd_report_body_is_never_a_server_error(
    client: TestClient, tokens: Tokens, body: bytes
) -> None:
    """Anything goes in; what comes out is a 4xx with a `detail`, or (odd but valid) an acknowledgement."""
    response = post_raw(client, tokens.reporter, body)

    assert response.status_code < 500, response.text
    if response.status_code == 200:
        assert set(response.json()) == {"duplicate", "gpu_minutes", "state"}
    else:
        assert response.status_code in (409, 422), response.text
        assert response.json()["detail"], response.text


@FUZZ
@given(
    field=st.sampled_from(FIELDS),
    value=st.one_of(
        st.none(),
        st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
        st.lists(st.none(), min_size=1, max_size=3),
    ),
)
def test_a_report_with_a_field_of_the_wrong_type_is_refused_422(
    client: TestClient, tokens: Tokens, field: str, value: Any
) -> None:
    """No field of a report may be null, an object or a list of nulls."""
    response = post_raw(client, tokens.reporter, with_field(field, encoded(value).decode()))

    assert response.status_code == 422, response.text
    assert response.json()["detail"]


# --- well-formed reports and budget changes: the ledger stays consistent ------------------------------

NAMESPACES = ("fuzz-a", "fuzz-b")
REPORTS = st.builds(
    lambda namespace, pod, seq, minutes_ago, minutes, share, final: report_body(
        namespace=namespace,
        pod=f"pod-{pod}",
        pod_uid=f"uid-{namespace}-{pod}",
        seq=seq,
        start=START - timedelta(minutes=minutes_ago),
        minutes=minutes,
        gpu_share=share,
        final=final,
    ),
    namespace=st.sampled_from(NAMESPACES),
    pod=st.integers(0, 2),
    seq=st.integers(0, 3),
    # Within the last three days, so intervals cross midnights (and daily periods) and overlap each other.
    minutes_ago=st.integers(60, 3 * 24 * 60),
    minutes=st.integers(1, 60),
    share=st.sampled_from([0.125, 0.333333, 0.5, 1, 2.5, 7]),
    final=st.booleans(),
)
BUDGET_CHANGES = st.tuples(
    st.sampled_from(NAMESPACES),
    st.sampled_from(["daily", "weekly", "monthly", "none"]),
    st.none() | st.integers(0, 500),
)


@FUZZ
@given(steps=st.lists(REPORTS | BUDGET_CHANGES, min_size=1, max_size=12))
def test_reports_and_budget_changes_keep_the_ledger_and_totals_in_step(
    client: TestClient, tokens: Tokens, fuzz_database: URL, steps: list[Any]
) -> None:
    """Overlapping, repeated and re-numbered reports, period kinds changing between them: every report is
    acknowledged, and the running totals always equal the ledger, with no time charged twice."""
    for step in steps:
        if isinstance(step, tuple):
            namespace, period, budget = step
            response = client.put(
                f"/namespaces/{namespace}/budget",
                json={"budget_gpu_minutes": budget, "period": period},
                headers=bearer(tokens.admin),
            )
        else:
            response = client.post("/reports", json=step, headers=bearer(tokens.reporter))
        assert response.status_code == 200, response.text
    assert_ledger_consistent(fuzz_database, client, tokens)
