"""What ingest charges by, read in its pipelined batch read (usage/repository.py IngestStatements): the
weights of the GPU models a batch names and the charge basis of its namespaces (billing's tables, which
billing/repository.py edits). Ingest owns these statements; billing does not import usage."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from functools import cache
from typing import Any

from timekeeper.db.lists import array_parameters, array_sql
from timekeeper.domain.weights import CLUSTER_SCOPE, WeightTimeline, timelines

# The weight changes of the models in `models` (a text[] expression, read as a set) that can apply to time
# in [since, until): each model's last change at or before since (the weight in force when the time
# starts) and those inside; the primary key (model, effective_from) finds both with one index search each.
# As text in a fixed order, so the same changes read by a later batch are parsed once (weight_timelines).
_WEIGHTS_OF = (
    "SELECT coalesce(jsonb_agg(jsonb_build_array(w.model, w.effective_from, w.weight::text) "
    "ORDER BY w.model, w.effective_from), '[]')::text FROM (SELECT DISTINCT unnest({models})) AS m(model) "
    "CROSS JOIN LATERAL ("
    "(SELECT x.model, x.effective_from, x.weight FROM gpu_weights x WHERE x.model = m.model "
    "AND x.effective_from <= %(since)s ORDER BY x.effective_from DESC LIMIT 1) UNION ALL "
    "SELECT x.model, x.effective_from, x.weight FROM gpu_weights x WHERE x.model = m.model "
    "AND x.effective_from > %(since)s AND x.effective_from < %(until)s) AS w"
)
# What a batch's charges need besides its pods: the weights of the GPU models its reports name (`pods`:
# the batch's pod rows, batch_json with gpu_model) and those models (NULL when no weight is set at all:
# then every model counts 1 and nothing is looked up); and the charge basis rows of the batch's namespaces
# and the cluster. A pod keeps the first model known, so one may have a model its report does not name:
# the caller reads those with `weights` (a round trip, only then). The models come from the reports, not
# from the pods' rows: a lookup of the batch's pods would be planned once, on a young table, as a scan.
# Run by the ingest's pipelined read (usage/repository.py IngestStatements), in the driver's style.
CHARGE_INPUTS = (
    "WITH a AS MATERIALIZED (SELECT CASE WHEN EXISTS (SELECT FROM gpu_weights) THEN ARRAY(SELECT DISTINCT "
    "jsonb_array_elements_text(jsonb_path_query_array(CAST(%(pods)s AS jsonb), "
    "'$[*].gpu_model ? (@ != null)'))) END AS models) "
    "SELECT ({weights}) AS weights, a.models, (SELECT coalesce(jsonb_agg(jsonb_build_array(scope, basis, "
    "floor::text)), '[]') FROM charge_basis WHERE scope = ANY(%(scopes)s)) AS bases FROM a"
).format(weights=_WEIGHTS_OF.format(models="a.models"))


@cache
def weights(arity: int | None) -> str:
    """The weights of the listed models (`models`, bound as lists.arity says)."""
    return _WEIGHTS_OF.format(models=array_sql("models", arity, "%({})s"))


def charge_inputs_parameters(
    pods: str, namespaces: Sequence[str], since: datetime, until: datetime
) -> dict[str, Any]:
    """`pods`: the batch's pod rows as IngestStatements.read gets them (batch_json, with gpu_model)."""
    return {"pods": pods, "scopes": [CLUSTER_SCOPE, *namespaces], "since": since, "until": until}


def weights_parameters(models: Sequence[str], since: datetime, until: datetime) -> dict[str, Any]:
    return {**array_parameters("models", models), "since": since, "until": until}


# Parsed weight timelines by their text (CHARGE_INPUTS, `weights`): batches in a row mostly read the same
# changes (the models and the weights in force do not change from one batch to the next), so each
# distinct answer is parsed once per process; a change set since reads as another text, so a cached
# answer is never stale. Bounded: a process forgets the answers it saw long ago.
_TIMELINES: dict[str, dict[str, WeightTimeline]] = {}
_TIMELINES_KEPT = 256


def weight_timelines(text: str) -> Mapping[str, WeightTimeline]:
    """A CHARGE_INPUTS or `weights` answer's text as timelines by model (shared: not to be changed)."""
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


@dataclass(frozen=True, slots=True)
class ChargeInputs:
    weights: Mapping[str, WeightTimeline]  # by model: the batch's reports' models that have weights
    read: frozenset[str] | None  # the models whose weights were read; None: no weight is set at all
    bases: dict[str, tuple[str, Decimal]]  # the basis rows by scope

    def unread(self, models: Iterable[str | None]) -> set[str]:
        """Of these models, those whose weights were not read (a pod's model its report did not name)."""
        if self.read is None:
            return set()
        return {model for model in models if model is not None and model not in self.read}


def charge_inputs(row: tuple[Any, ...] | None) -> ChargeInputs:
    """CHARGE_INPUTS' one row."""
    assert row is not None, "an aggregate answers one row"
    weights, models, bases = row
    return ChargeInputs(
        weight_timelines(weights),
        None if models is None else frozenset(models),
        {scope: (basis, Decimal(floor)) for scope, basis, floor in bases},
    )
