"""What the fuzzers (test_api_fuzz.py) found, pinned as concrete examples: each was a 500."""

from __future__ import annotations

from datetime import timedelta

import orjson
import pytest

from tests.support.timekeeper import Api, bearer, report_body
from tests.timekeeper.conftest import START

pytestmark = pytest.mark.asyncio(loop_scope="session")

REPORT = orjson.dumps(report_body(start=START - timedelta(minutes=30)))


def replaced(field: str, literal: bytes) -> bytes:
    """The report with one field's value replaced by raw text a JSON encoder would never write."""
    body = orjson.loads(REPORT)
    del body[field]
    return orjson.dumps(body)[:-1] + b',"' + field.encode() + b'":' + literal + b"}"


NOT_JSON = {
    "NaN share": replaced("gpu_share", b"NaN"),
    "Infinity share": replaced("gpu_share", b"Infinity"),
    "share beyond a double": replaced("gpu_share", b"1e400"),
    "NaN where a boolean belongs": replaced("final", b"NaN"),
    "NaN inside a GPU's figures": replaced("gpus", b'[{"uuid": "GPU-0", "sm_util_pct": -Infinity}]'),
    "lone surrogate in the namespace": replaced("namespace", b'"\\ud800"'),
    "not UTF-8": b'{"namespace": "\xff"}',
}


@pytest.mark.parametrize("body", NOT_JSON.values(), ids=NOT_JSON.keys())
async def test_a_report_that_is_not_strict_json_is_answered_422(api: Api, body: bytes) -> None:
    response = await api.client.post(
        "/reports", content=body, headers=bearer(api.tokens.reporter) | {"Content-Type": "application/json"}
    )

    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["type"] == "json_invalid"
    assert (await api.budget("team-a"))["used_gpu_minutes"] == 0


async def test_a_budget_with_a_lone_surrogate_key_is_answered_422(api: Api) -> None:
    response = await api.client.put(
        "/namespaces/team-a/budget",
        content=b'{"budget_gpu_minutes": 10, "\\udfff": 1}',
        headers=bearer(api.tokens.admin) | {"Content-Type": "application/json"},
    )

    assert response.status_code == 422, response.text


async def test_a_grant_finer_than_a_nano_gpu_minute_is_answered_422(api: Api) -> None:
    response = await api.grant("team-a", 5e-324)

    assert response.status_code == 422, response.text
    assert "decimal places" in response.text
    assert (await api.budget("team-a"))["granted_gpu_minutes"] == 0


async def test_a_grant_at_the_ledger_scale_is_accepted(api: Api) -> None:
    response = await api.grant("team-a", 0.000000001)

    assert response.status_code == 201, response.text
    assert (await api.budget("team-a"))["granted_gpu_minutes"] == 1e-9


async def test_a_grant_whose_reason_holds_a_nul_is_answered_422(api: Api) -> None:
    response = await api.grant("team-a", 5, reason="deadline\x00")

    assert response.status_code == 422, response.text
    assert (await api.budget("team-a"))["granted_gpu_minutes"] == 0


async def test_a_report_whose_gpu_uuid_holds_a_nul_is_answered_422(api: Api) -> None:
    response = await api.report(start=START - timedelta(minutes=30), gpus=[{"uuid": "GPU-\x00"}])

    assert response.status_code == 422, response.text
    assert (await api.budget("team-a"))["used_gpu_minutes"] == 0


async def test_an_audit_page_before_an_id_beyond_bigint_is_answered_422(api: Api) -> None:
    response = await api.get("/audit", before_id=2**63)

    assert response.status_code == 422, response.text
