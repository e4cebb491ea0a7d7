"""The recorded budget answers the faces are tested with (tests/support/model_budgets.py: the CLI, the
dashboard) are answers the API can give: each validates as the API's own answer model, with no field the
model does not define, so a face cannot be tested against a shape the timekeeper does not send."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from tests.support import model_budgets
from timekeeper.budgets.schemas import ModelBudgetOut, NamespaceBudgetOut


def _unknown_fields(answer: dict[str, Any], model: type[BaseModel]) -> set[str]:
    return set(answer) - set(model.model_fields)


@pytest.mark.parametrize("answer", [model_budgets.team_a(), model_budgets.team_b(), model_budgets.team_c()])
def test_each_recorded_answer_is_one_the_api_gives(answer: dict[str, Any]) -> None:
    NamespaceBudgetOut.model_validate(answer)
    assert not _unknown_fields(answer, NamespaceBudgetOut)
    for entry in answer.get("models", {}).values():
        assert not _unknown_fields(entry, ModelBudgetOut)
        assert not _unknown_fields(entry["forecast"], ModelBudgetOut.model_fields["forecast"].annotation)  # type: ignore[arg-type]
