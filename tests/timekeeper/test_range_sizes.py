"""A request is sized before it is expanded (issue #38): the chargeback export counts a range's periods by
arithmetic and refuses too many before building one, and every time a query names answers 4xx at the
edges of what a datetime holds (year 1, year 9999, offsets that carry past either), never a 500."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.timekeeper import Api, bearer
from timekeeper.billing import chargeback
from timekeeper.domain.periods import PeriodKind, count_periods, periods_overlapping

on_the_loop = pytest.mark.asyncio(loop_scope="session")

EDGES = (
    "0001-01-01T00:00:00Z",
    "0001-01-01T00:00:00+01:00",  # before year 1 in UTC
    "9999-12-31T00:00:00Z",
    "9999-12-31T23:59:59-01:00",  # after year 9999 in UTC
    "1969-12-31T23:59:59Z",
    "9000-01-01T00:00:00Z",
)


def _never_built(*args: object) -> list[object]:
    raise AssertionError("a period list was built for a range refused by its size")


@on_the_loop
@pytest.mark.parametrize(
    ("since", "until", "period", "detail"),
    [
        ("0001-01-01T00:00:00Z", "9999-12-31T00:00:00Z", "monthly", "must lie between 1970 and 9000"),
        ("0001-01-01T00:00:00Z", "9999-12-31T00:00:00Z", "daily", "must lie between 1970 and 9000"),
        ("1970-01-01T00:00:00Z", "8999-12-31T00:00:00Z", "daily", "holds 2567654 daily periods; at most 400"),
        ("1970-01-01T00:00:00Z", "8999-12-31T00:00:00Z", "monthly", "holds 84360 monthly periods; at most"),
    ],
)
async def test_a_chargeback_range_too_long_is_refused_before_a_period_is_built(
    api: Api, monkeypatch: pytest.MonkeyPatch, since: str, until: str, period: str, detail: str
) -> None:
    monkeypatch.setattr(chargeback, "periods_overlapping", _never_built)

    response = await api.client.get(
        "/billing/chargeback",
        params={"since": since, "until": until, "period": period},
        headers=bearer(api.tokens.reader),
    )

    assert response.status_code == 422
    assert detail in response.text


async def _time_parameters(api: Api) -> list[tuple[str, str]]:
    """Every (GET path, query parameter) of the OpenAPI document whose parameter is a time."""
    document = (await api.client.get("http://timekeeper/openapi.json")).json()
    return [
        ("http://timekeeper" + path.replace("{namespace}", "team-a"), parameter["name"])
        for path, operations in document["paths"].items()
        for parameter in operations.get("get", {}).get("parameters", [])
        if parameter["name"] in ("since", "until")
    ]


@on_the_loop
async def test_every_time_parameter_is_found(api: Api) -> None:
    assert len(await _time_parameters(api)) >= 8  # those of today; a new one is found alike


@on_the_loop
@pytest.mark.parametrize("edge", EDGES)
async def test_a_time_at_the_edge_of_a_datetime_is_a_422_on_every_query(api: Api, edge: str) -> None:
    for path, name in await _time_parameters(api):
        for period in ("daily", "weekly", "monthly"):
            response = await api.client.get(
                path, params={name: edge, "period": period}, headers=bearer(api.tokens.admin)
            )

            assert response.status_code == 422, (path, name, response.text[:200])
            assert response.json()["detail"][0]["loc"] == ["query", name], (path, name)


_MOMENTS = st.datetimes(
    min_value=datetime(1970, 1, 1), max_value=datetime(8999, 1, 1), timezones=st.just(UTC)
)


@settings(derandomize=True, deadline=None)
@given(_MOMENTS, st.timedeltas(min_value=timedelta(microseconds=1), max_value=timedelta(days=400)))
def test_count_periods_is_the_length_of_the_list(start: datetime, length: timedelta) -> None:
    for kind in PeriodKind:
        assert count_periods(kind, start, start + length) == len(
            periods_overlapping(kind, start, start + length)
        )
