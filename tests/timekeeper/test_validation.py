"""Bad input gets a precise 4xx with a `detail`, never a 500, and charges nothing."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import orjson
import pytest

from tests.support.timekeeper import Api, bearer, ok, report_body
from tests.timekeeper.conftest import START

pytestmark = pytest.mark.asyncio(loop_scope="session")

EARLIER = START - timedelta(minutes=30)


def report(**overrides: Any) -> dict[str, Any]:
    return report_body(**{"start": EARLIER, **overrides})


BAD_REPORTS = {
    "end before start": report(end=EARLIER - timedelta(seconds=1)),
    "end equal to start": report(end=EARLIER),
    "interval longer than the maximum": report(end=EARLIER + timedelta(hours=1, seconds=1)),
    "interval in the future beyond the skew": report(start=START, end=START + timedelta(seconds=61)),
    "zero share": report(gpu_share=0),
    "negative share": report(gpu_share=-1),
    "absurd share": report(gpu_share=1e6),
    "share not a number": report(gpu_share="lots"),
    "namespace with capitals": report(namespace="Team-A"),
    "namespace too long": report(namespace="a" * 64),
    "namespace with a slash": report(namespace="team/a"),
    "pod with an underscore": report(pod="trainer_0"),
    "empty pod uid": report(pod_uid=""),
    "negative seq": report(seq=-1),
    "seq beyond bigint": report(seq=2**63),
    "timestamp without offset": report(interval_start="2026-03-18T11:00:00"),
    "timestamp not a time": report(interval_start="yesterday"),
    "utilisation above 100": report(gpus=[{"uuid": "GPU-0", "sm_util_pct": 101}]),
    "gpu without uuid": report(gpus=[{"sm_util_pct": 10}]),
    "missing field": {key: value for key, value in report().items() if key != "pod_uid"},
    "year 1 at +01:00, before year 1 in UTC": report(interval_start="0001-01-01T00:00:00+01:00"),
    "before the Unix epoch": report(
        interval_start="1969-12-31T23:59:00Z", interval_end="1970-01-01T00:00:00Z"
    ),
    "older than the oldest accepted": report(start=START - timedelta(days=31, minutes=1)),
    "unix seconds for a timestamp": report(interval_start=int(EARLIER.timestamp())),
    "unix seconds as a string": report(interval_start=str(int(EARLIER.timestamp()))),
    "a date without a time": report(interval_start="2026-03-18"),
    "share as a string": report(gpu_share="0.5"),
    "share as a boolean": report(gpu_share=True),
    "share absurdly small": report(gpu_share=1e-300),
    "seq as a string": report(seq="1"),
    "final as a number": report(final=1),
    "utilisation as a string": report(gpus=[{"uuid": "GPU-0", "sm_util_pct": "50"}]),
}


@pytest.mark.parametrize("body", BAD_REPORTS.values(), ids=BAD_REPORTS.keys())
async def test_a_bad_report_is_answered_422_and_charges_nothing(api: Api, body: dict[str, Any]) -> None:
    response = await api.client.post("/reports", json=body, headers=bearer(api.tokens.reporter))

    assert response.status_code == 422, response.text
    assert response.json()["detail"]
    assert (await api.budget("team-a"))["used_gpu_minutes"] == 0


async def test_a_report_with_a_repeated_key_is_refused_and_charges_nothing(api: Api) -> None:
    body = orjson.dumps(report(gpu_share=0.5))[:-1] + b',"gpu_share":200}'
    headers = {**bearer(api.tokens.reporter), "Content-Type": "application/json"}

    response = await api.client.post("/reports", content=body, headers=headers)

    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["type"] == "json_invalid" and "gpu_share" in error["ctx"]["error"]
    assert (await api.budget("team-a"))["used_gpu_minutes"] == 0


async def test_a_repeated_key_inside_a_gpu_is_refused_too(api: Api) -> None:
    body = orjson.dumps(report(gpus=[{"uuid": "GPU-0"}])).replace(b'"GPU-0"', b'"GPU-0","uuid":"GPU-1"')
    headers = {**bearer(api.tokens.reporter), "Content-Type": "application/json"}

    response = await api.client.post("/reports", content=body, headers=headers)

    assert response.status_code == 422, response.text


async def test_a_report_just_within_the_oldest_accepted_is_charged(api: Api) -> None:
    ack = ok(await api.report(start=START - timedelta(days=31) + timedelta(minutes=1)))

    assert ack["gpu_minutes"] == 1


@pytest.mark.parametrize("body", [b"{not json", b'{"gpu_share": "lots"}'])
async def test_no_token_is_a_401_whatever_the_body(api: Api, body: bytes) -> None:
    response = await api.client.post("/reports", content=body, headers={"Content-Type": "application/json"})

    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"


async def test_the_openapi_says_what_a_report_accepts(api: Api) -> None:
    schemas = ok(await api.client.get("http://timekeeper/openapi.json"))["components"]["schemas"]
    fields = schemas["ReportIn"]["properties"]

    assert fields["interval_start"] == {"type": "string", "format": "date-time", "title": "Interval Start"}
    assert fields["gpu_share"]["type"] == "number" and fields["gpu_share"]["minimum"] > 0
    assert fields["seq"]["type"] == "integer"
    assert fields["gpus"]["items"] == {"$ref": "#/components/schemas/GpuFiguresIn"}
    assert "GpuFiguresIn" in schemas


async def test_a_report_within_the_skew_allowance_is_accepted(api: Api) -> None:
    ack = ok(await api.report(start=START - timedelta(seconds=30), end=START + timedelta(seconds=30)))

    assert ack["gpu_minutes"] == 1


@pytest.mark.parametrize(
    ("content", "content_type"),
    [
        (b"{not json", "application/json"),
        (b"", "application/json"),
        (b"[1, 2]", "application/json"),
        (b"namespace=team-a", "application/x-www-form-urlencoded"),
    ],
)
async def test_a_body_that_is_not_a_json_report_is_answered_422(
    api: Api, content: bytes, content_type: str
) -> None:
    response = await api.client.post(
        "/reports", content=content, headers={**bearer(api.tokens.reporter), "Content-Type": content_type}
    )

    assert response.status_code == 422
    assert response.json()["detail"]


async def test_a_body_too_large_is_answered_413(api: Api) -> None:
    body = report(gpus=[{"uuid": "GPU-" + "x" * 120, "sm_util_pct": 1.0}] * 64, padding="y" * 70_000)

    response = await api.client.post("/reports", json=body, headers=bearer(api.tokens.reporter))

    assert response.status_code == 413
    assert "larger than" in response.json()["detail"]


async def test_a_streamed_body_too_large_is_answered_413(api: Api) -> None:
    async def chunks():  # no Content-Length: the limit holds while streaming
        for _ in range(100):
            yield b" " * 1024

    response = await api.client.post(
        "/reports",
        content=chunks(),
        headers={**bearer(api.tokens.reporter), "Content-Type": "application/json"},
    )

    assert response.status_code == 413


async def test_an_anonymous_body_is_refused_before_it_is_read(api: Api) -> None:
    """No write is anonymous: a body route answers a caller with no credential 401 before reading its body,
    however large (a token it does not accept is read first: FastAPI reads a declared body before it solves
    the dependencies, so that body over the limit is a 413)."""

    async def chunks():
        for _ in range(100):
            yield b" " * 1024

    anonymous = await api.client.post(
        "/reports", content=chunks(), headers={"Content-Type": "application/json"}
    )
    unknown = await api.client.post(
        "/reports", content=chunks(), headers={**bearer("not-a-token"), "Content-Type": "application/json"}
    )

    assert anonymous.status_code == 401
    assert unknown.status_code == 413


BAD_BUDGETS = {
    "negative budget": {"budget_gpu_minutes": -1},
    "budget not a number": {"budget_gpu_minutes": "many"},
    "unknown period": {"budget_gpu_minutes": 1, "period": "hourly"},
    "warn fraction zero": {"budget_gpu_minutes": 1, "warn_at_fraction": 0},
    "warn fraction above one": {"budget_gpu_minutes": 1, "warn_at_fraction": 1.5},
    "zero share cap": {"budget_gpu_minutes": 1, "max_gpu_share_per_pod": 0},
    "unknown field": {"budget_gpu_minutes": 1, "budget": 2},
    "absurd budget": {"budget_gpu_minutes": 1e15},
}


@pytest.mark.parametrize("body", BAD_BUDGETS.values(), ids=BAD_BUDGETS.keys())
async def test_a_bad_budget_is_answered_422_and_changes_nothing(api: Api, body: dict[str, Any]) -> None:
    for path in ("/namespaces/team-a/budget", "/defaults"):
        response = await api.client.put(path, json=body, headers=bearer(api.tokens.admin))
        assert response.status_code == 422, response.text
    assert ok(await api.get("/audit")) == []


@pytest.mark.parametrize(
    "body",
    [{"gpu_minutes": 0, "reason": "x"}, {"gpu_minutes": -5, "reason": "x"}, {"gpu_minutes": 5, "reason": ""}],
)
async def test_a_bad_grant_is_answered_422(api: Api, body: dict[str, Any]) -> None:
    response = await api.client.post("/namespaces/team-a/grants", json=body, headers=bearer(api.tokens.admin))

    assert response.status_code == 422


@pytest.mark.parametrize("namespace", ["Team-A", "-team", "a" * 64, "team_a"])
async def test_a_bad_namespace_in_the_path_is_answered_422(api: Api, namespace: str) -> None:
    response = await api.client.get(f"/namespaces/{namespace}/budget", headers=bearer(api.tokens.reader))

    assert response.status_code == 422


@pytest.mark.parametrize(
    "params",
    [
        {"group_by": "week"},
        {"since": "2026-03-18T10:00:00Z", "until": "2026-03-18T09:00:00Z"},
        {"since": "2026-03-18T10:00:00"},
        {"since": "soon"},
    ],
)
async def test_a_bad_usage_query_is_answered_422(api: Api, params: dict[str, str]) -> None:
    response = await api.get("/namespaces/team-a/usage", **params)

    assert response.status_code == 422
