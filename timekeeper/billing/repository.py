"""SQL for weights, prices and the charge basis: Core statements on the billing models."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from timekeeper.billing.models import CLUSTER_SCOPE, ChargeBasis, GpuPrice, GpuWeight
from timekeeper.billing.weights import WeightTimeline, timelines
from timekeeper.usage.models import RUNNING_POD, PodCoverage

# The weight changes that can apply to the batch's time [since, until): for each GPU model its pods have
# (read after the pods are locked, so a model named first by this batch counts), the model's last change
# at or before since (the weight in force when the time starts) and those inside; the primary key (model,
# effective_from) finds both with one index search each (and with no weights set, nothing is looked up).
# As text in a fixed order, so the same changes read by the next batch are parsed once (charge_inputs).
# With the charge basis rows of the batch's namespaces and the cluster. Run by the ingest's pipelined read
# (usage/repository.py IngestStatements), so in the driver's parameter style.
CHARGE_INPUTS = (
    "SELECT (SELECT coalesce(jsonb_agg(jsonb_build_array(w.model, w.effective_from, w.weight::text) "
    "ORDER BY w.model, w.effective_from), '[]')::text "
    "FROM (SELECT DISTINCT c.gpu_model FROM pod_coverage c WHERE c.pod_uid = ANY(ARRAY("
    "SELECT jsonb_array_elements_text(jsonb_path_query_array(CAST(%(pods)s AS jsonb), '$[*].pod_uid')))) "
    "AND c.gpu_model IS NOT NULL AND EXISTS (SELECT FROM gpu_weights)) AS m CROSS JOIN LATERAL ("
    "(SELECT x.model, x.effective_from, x.weight FROM gpu_weights x WHERE x.model = m.gpu_model "
    "AND x.effective_from <= %(since)s ORDER BY x.effective_from DESC LIMIT 1) UNION ALL "
    "SELECT x.model, x.effective_from, x.weight FROM gpu_weights x WHERE x.model = m.gpu_model "
    "AND x.effective_from > %(since)s AND x.effective_from < %(until)s) AS w) AS weights, "
    "(SELECT coalesce(jsonb_agg(jsonb_build_array(scope, basis, floor::text)), '[]') FROM charge_basis "
    "WHERE scope = ANY(%(scopes)s)) AS bases"
)


def charge_inputs_parameters(
    pods: str, namespaces: Sequence[str], since: datetime, until: datetime
) -> dict[str, Any]:
    """`pods`: the batch's pod rows as IngestStatements.read gets them (batch_json, with pod_uid)."""
    return {"pods": pods, "scopes": [CLUSTER_SCOPE, *namespaces], "since": since, "until": until}


# Parsed weight timelines by CHARGE_INPUTS' text of them: batches in a row mostly read the same changes
# (the models' and the weights in force do not change from one batch to the next), so each distinct
# answer is parsed once per process. Bounded: an answer changes when a batch's span crosses a change or its
# pods' models differ, and a long-running process forgets the ones seen long ago.
_TIMELINES: dict[str, dict[str, WeightTimeline]] = {}
_TIMELINES_KEPT = 256


def _timelines(text: str) -> dict[str, WeightTimeline]:
    known = _TIMELINES.get(text)
    if known is None:
        known = timelines(
            (model, datetime.fromisoformat(since), Decimal(weight))
            for model, since, weight in json.loads(text)
        )
        if len(_TIMELINES) >= _TIMELINES_KEPT:
            _TIMELINES.clear()
        _TIMELINES[text] = known
    return known


def charge_inputs(
    row: tuple[Any, ...] | None,
) -> tuple[Mapping[str, WeightTimeline], dict[str, tuple[str, Decimal]]]:
    """CHARGE_INPUTS' one row as the weight timelines by model (shared: not to be changed) and the basis
    rows by scope."""
    assert row is not None, "an aggregate answers one row"
    weights, bases = row
    return _timelines(weights), {scope: (basis, Decimal(floor)) for scope, basis, floor in bases}


class BillingRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def weight_changes(self) -> Sequence[GpuWeight]:
        return (
            await self.session.scalars(
                sa.select(GpuWeight).order_by(GpuWeight.model, GpuWeight.effective_from)
            )
        ).all()

    async def timelines(self, models: Sequence[str]) -> dict[str, WeightTimeline]:
        """The weight timelines of these models (absent: never weighted)."""
        if not models:
            return {}
        result = await self.session.execute(
            sa.select(GpuWeight.model, GpuWeight.effective_from, GpuWeight.weight).where(
                GpuWeight.model.in_(models)
            )
        )
        return timelines(result.tuples())

    async def running_pods_without_model(self) -> dict[str, int]:
        """Per namespace, the running pods no source has named a GPU model for (they count weight 1)."""
        result = await self.session.execute(
            sa.select(PodCoverage.namespace, sa.func.count())
            .where(RUNNING_POD, PodCoverage.gpu_model.is_(None))
            .group_by(PodCoverage.namespace)
        )
        return dict(result.tuples().all())

    async def set_weight(self, model: str, weight: Decimal, effective_from: datetime, actor: str) -> None:
        statement = insert(GpuWeight).values(
            model=model, effective_from=effective_from, weight=weight, set_by=actor
        )
        await self.session.execute(
            statement.on_conflict_do_update(
                index_elements=[GpuWeight.model, GpuWeight.effective_from],
                set_={"weight": statement.excluded.weight, "set_by": statement.excluded.set_by},
            )
        )

    async def prices(self) -> Sequence[GpuPrice]:
        return (await self.session.scalars(sa.select(GpuPrice).order_by(GpuPrice.model))).all()

    async def price(self, model: str) -> GpuPrice | None:
        return await self.session.get(GpuPrice, model, populate_existing=True)

    async def set_price(self, model: str, price: Decimal, actor: str, now: datetime) -> None:
        statement = insert(GpuPrice).values(
            model=model, price_per_gpu_hour=price, updated_at=now, updated_by=actor
        )
        await self.session.execute(
            statement.on_conflict_do_update(
                index_elements=[GpuPrice.model],
                set_={
                    "price_per_gpu_hour": statement.excluded.price_per_gpu_hour,
                    "updated_at": statement.excluded.updated_at,
                    "updated_by": statement.excluded.updated_by,
                },
            )
        )

    async def delete_price(self, model: str) -> bool:
        result = await self.session.execute(sa.delete(GpuPrice).where(GpuPrice.model == model))
        return bool(result.rowcount)  # type: ignore[attr-defined]

    async def bases(self, namespaces: Sequence[str]) -> dict[str, tuple[str, Decimal]]:
        """The charge basis rows of these namespaces and of the cluster (CLUSTER_SCOPE), where set."""
        result = await self.session.execute(
            sa.select(ChargeBasis.scope, ChargeBasis.basis, ChargeBasis.floor).where(
                ChargeBasis.scope.in_([CLUSTER_SCOPE, *namespaces])
            )
        )
        return {scope: (basis, floor) for scope, basis, floor in result.tuples()}

    async def set_basis(self, scope: str, basis: str, floor: Decimal, actor: str, now: datetime) -> None:
        statement = insert(ChargeBasis).values(
            scope=scope, basis=basis, floor=floor, updated_at=now, updated_by=actor
        )
        await self.session.execute(
            statement.on_conflict_do_update(
                index_elements=[ChargeBasis.scope],
                set_={
                    "basis": statement.excluded.basis,
                    "floor": statement.excluded.floor,
                    "updated_at": statement.excluded.updated_at,
                    "updated_by": statement.excluded.updated_by,
                },
            )
        )

    async def delete_basis(self, scope: str) -> bool:
        result = await self.session.execute(sa.delete(ChargeBasis).where(ChargeBasis.scope == scope))
        return bool(result.rowcount)  # type: ignore[attr-defined]
