"""The GPUBudget spec as a BudgetIn, and a namespace's budget status as the object's status: pure functions,
no database, no cluster (the sync that uses them runs against a real API server in tests/cluster)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from gpuaccounting.admission_state import default_priority_policy
from timekeeper.budgets.schemas import (
    ForecastOut,
    ModelBudgetOut,
    ModelForecastOut,
    NamespaceBudgetOut,
    PriorityPolicyBody,
)
from timekeeper.domain.periods import PeriodKind
from timekeeper.gitops.objects import (
    SPEC_FIELDS,
    ObjectRef,
    Readiness,
    SpecError,
    applied,
    budget_in,
    budget_status,
    default_status,
    figure,
    owner_of,
    stored_json,
    substance,
)
from timekeeper.schemas import PeriodOut

NOW = datetime(2026, 3, 18, 12, 0, tzinfo=UTC)
CRDS = Path(__file__).resolve().parents[2] / "deployment" / "base" / "crds"
REF = ObjectRef("GPUBudget", "team-a", "budget", "uid-1", 3)


def test_a_full_spec_maps_to_the_body_a_put_would_take() -> None:
    body = budget_in(
        {
            "budgetGPUMinutes": 6000,
            "period": "weekly",
            "warnAtFraction": Decimal("0.75"),
            "maxGPUSharePerPod": Decimal("0.5"),
            "concurrentGPULimit": 8,
            "runningPodAction": "evict",
            "priorityPolicy": {"exemptClasses": ["b", "a", "a"], "userClasses": "replace", "ceiling": 100},
        }
    )
    assert body.budget_gpu_minutes == 6000 and body.period is PeriodKind.WEEKLY
    assert (body.warn_at_fraction, body.max_gpu_share_per_pod, body.concurrent_gpu_limit) == (
        Decimal("0.75"),
        Decimal("0.5"),
        8,
    )
    assert body.running_pod_action == "evict"
    assert body.priority_policy == PriorityPolicyBody(
        exempt_classes=["a", "b"], user_classes="replace", ceiling=100
    )


def test_an_empty_spec_is_unlimited_monthly_and_follows_the_default_in_everything_else() -> None:
    body = budget_in({})
    assert body.budget_gpu_minutes is None and body.period is PeriodKind.MONTHLY
    assert body.warn_at_fraction == Decimal("0.8")
    # Stated, not omitted: a REST PUT that omits them keeps the current value; the object is the truth.
    assert {"priority_policy", "running_pod_action"} <= body.model_fields_set
    assert body.priority_policy is None and body.running_pod_action is None


def test_a_policy_without_a_ceiling_has_none() -> None:
    body = budget_in({"priorityPolicy": {"exemptClasses": [], "userClasses": "keep_up_to_ceiling"}})
    assert body.priority_policy is not None and body.priority_policy.ceiling is None


@pytest.mark.parametrize(
    ("spec", "complaint"),
    [
        ({"warnAtFraction": Decimal("0.12345")}, "spec.warnAtFraction"),  # what the schema cannot say
        ({"budgetGPUMinutes": -1}, "spec.budgetGPUMinutes"),
        ({"budgetGPUMinutes": 10**12 + 1}, "spec.budgetGPUMinutes"),
        ({"period": "yearly"}, "spec.period"),
        ({"maxGPUSharePerPod": 0}, "spec.maxGPUSharePerPod"),
        ({"runningPodAction": "kill"}, "spec.runningPodAction"),
        ({"priorityPolicy": {"exemptClasses": ["Bad_Name"], "userClasses": "replace"}}, "exemptClasses"),
        ({"priorityPolicy": {"exemptClasses": [], "userClasses": "x", "bogus": 1}}, "bogus"),
        ({"budgetGPUMinute": 5}, "unknown spec fields: budgetGPUMinute"),
    ],
)
def test_what_the_budget_api_refuses_is_a_spec_error_in_the_objects_own_names(spec, complaint) -> None:
    with pytest.raises(SpecError, match=complaint.replace(".", r"\.")):
        budget_in(spec)


def test_stored_json_is_what_the_audit_log_says_the_database_holds() -> None:
    body = budget_in({"budgetGPUMinutes": Decimal("100.50"), "warnAtFraction": Decimal("0.8000")})
    assert stored_json(body, cluster_default=False) == {
        "budget_gpu_minutes": "100.5",
        "period": "monthly",
        "warn_at_fraction": "0.8",
        "max_gpu_share_per_pod": None,
        "concurrent_gpu_limit": None,
        "priority_policy": None,
        "running_pod_action": None,
        "models": None,
        "model_policy": "reduce",
    }
    # The default follows nothing: absent enforcement fields are the shipped ones.
    default = stored_json(body, cluster_default=True)
    assert default["priority_policy"] == default_priority_policy()
    assert default["running_pod_action"] == "none"


def test_spec_models_become_the_apis_models_and_its_errors_name_the_spec() -> None:
    body = budget_in(
        {"models": {"NVIDIA H100 80GB HBM3": {"budgetGPUMinutes": 6000}}, "modelPolicy": "steer"}
    )
    assert stored_json(body, cluster_default=False)["models"] == {"NVIDIA-H100-80GB-HBM3": "6000"}
    assert body.model_policy == "steer"
    with pytest.raises(SpecError, match=r"spec\.models\.Tesla-T4\.budgetGPUMinutes"):
        budget_in({"models": {"Tesla-T4": {"budgetGPUMinutes": -1}}})
    with pytest.raises(SpecError, match=r"unknown spec\.models\.Tesla-T4 fields: budgetGpuMinutes"):
        budget_in({"models": {"Tesla-T4": {"budgetGpuMinutes": 1}}})
    with pytest.raises(SpecError, match="same GPU model"):
        budget_in({"models": {"Tesla-T4": {"budgetGPUMinutes": 1}, "tesla t4": {"budgetGPUMinutes": 2}}})


def _status(
    used: str,
    budget: str | None = "100",
    granted: str = "0",
    state: str = "in_budget",
    forecast: ForecastOut | None = None,
) -> NamespaceBudgetOut:
    limit = None if budget is None else Decimal(budget)
    remaining = None if limit is None else limit + Decimal(granted) - Decimal(used)
    return NamespaceBudgetOut(
        namespace="team-a",
        source="namespace",
        period=PeriodOut(
            kind=PeriodKind.MONTHLY,
            start=datetime(2026, 3, 1, tzinfo=UTC),
            end=datetime(2026, 4, 1, tzinfo=UTC),
        ),
        budget_gpu_minutes=limit,
        granted_gpu_minutes=Decimal(granted),
        used_gpu_minutes=Decimal(used),
        remaining_gpu_minutes=remaining,
        state=state,  # type: ignore[arg-type]
        priority_class="gpu-in-budget",
        warn_at_fraction=Decimal("0.8"),
        max_gpu_share_per_pod=None,
        concurrent_gpu_limit=None,
        priority_policy=PriorityPolicyBody.model_validate(default_priority_policy()),
        priority_policy_source="default",
        running_pod_action="none",
        running_pod_action_source="default",
        forecast=forecast
        or ForecastOut(window_minutes=60, burn_rate_gpu_minutes_per_hour=0, exhausts_at=None),
    )


def _conditions(status: dict) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_the_status_carries_the_figures_rounded_and_the_conditions_follow_the_state() -> None:
    status = budget_status(_status("12.345678912"), applied(REF), 3, None, NOW)
    assert status["observedGeneration"] == 3
    assert status["period"] == {
        "kind": "monthly",
        "start": "2026-03-01T00:00:00Z",
        "end": "2026-04-01T00:00:00Z",
    }
    assert (status["budgetGPUMinutes"], status["usedGPUMinutes"], status["remainingGPUMinutes"]) == (
        "100",
        "12.35",
        "87.65",
    )
    assert status["state"] == "in_budget"
    assert status["forecast"] == {"windowMinutes": 60, "burnRateGPUMinutesPerHour": "0"}
    assert _conditions(status) == {
        "Ready": ("True", "Applied"),
        "Warning": ("False", "BelowWarnFraction"),
        "Exhausted": ("False", "BudgetRemaining"),
    }

    warning = budget_status(_status("85", state="warning"), applied(REF), 3, status, NOW)
    assert _conditions(warning)["Warning"] == ("True", "WarnFractionReached")
    exhausted = budget_status(_status("100.5", state="exhausted"), applied(REF), 3, warning, NOW)
    assert _conditions(exhausted)["Exhausted"] == ("True", "BudgetExhausted")
    assert exhausted["remainingGPUMinutes"] == "-0.5"
    assert "100.5 of 100 GPU-minutes used" in exhausted["conditions"][2]["message"]


def test_an_unlimited_namespace_has_no_budget_nor_remaining_figure() -> None:
    status = budget_status(_status("7", budget=None, state="unlimited"), applied(REF), 1, None, NOW)
    assert "budgetGPUMinutes" not in status and "remainingGPUMinutes" not in status
    assert status["state"] == "unlimited"


def test_a_status_that_says_the_same_is_the_same_status() -> None:
    """lastTransitionTime moves only with a condition's status, so an unchanged status is not rewritten."""
    first = budget_status(_status("10"), applied(REF), 3, None, NOW)
    later = NOW + timedelta(hours=1)
    assert budget_status(_status("10"), applied(REF), 3, first, later) == first
    moved = budget_status(_status("90", state="warning"), applied(REF), 3, first, later)
    times = {c["type"]: c["lastTransitionTime"] for c in moved["conditions"]}
    assert times == {
        "Ready": "2026-03-18T12:00:00Z",
        "Warning": "2026-03-18T13:00:00Z",
        "Exhausted": "2026-03-18T12:00:00Z",
    }


def test_a_spec_not_in_force_says_why_beside_the_figures_in_force() -> None:
    readiness = Readiness(False, "InvalidSpec", "not applied: spec.warnAtFraction: ...")
    status = budget_status(_status("10"), readiness, 4, None, NOW)
    assert _conditions(status)["Ready"] == ("False", "InvalidSpec")
    assert status["observedGeneration"] == 4 and status["usedGPUMinutes"] == "10"
    assert default_status(readiness, 2, None, NOW)["conditions"][0]["reason"] == "InvalidSpec"


def test_figures_round_to_the_hundredth_without_exponent_or_trailing_zeros() -> None:
    assert [figure(Decimal(v)) for v in ("1E+3", "0.005", "0.015", "12.10", "-3")] == [
        "1000",
        "0",
        "0.02",
        "12.1",
        "-3",
    ]
    assert figure(None) is None


def test_the_oldest_object_in_a_namespace_governs_it() -> None:
    def obj(name: str, created: str) -> dict:
        return {"metadata": {"name": name, "creationTimestamp": created}}

    assert (
        owner_of([obj("b", "2026-01-02T00:00:00Z"), obj("a", "2026-01-03T00:00:00Z")])["metadata"]["name"]
        == "b"
    )
    assert (
        owner_of([obj("b", "2026-01-02T00:00:00Z"), obj("a", "2026-01-02T00:00:00Z")])["metadata"]["name"]
        == "a"
    )


def _crd(name: str) -> dict:
    return yaml.safe_load((CRDS / f"{name}.yaml").read_text())


def _spec_schema(name: str) -> dict:
    (version,) = _crd(name)["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_the_crd_schemas_state_exactly_the_fields_the_mapping_takes() -> None:
    for name in ("gpubudgets", "gpubudgetdefaults"):
        assert set(_spec_schema(name)["properties"]) == set(SPEC_FIELDS), name
    strip = lambda schema: {k: v for k, v in schema["properties"].items()}  # noqa: E731
    budgets, defaults = strip(_spec_schema("gpubudgets")), strip(_spec_schema("gpubudgetdefaults"))
    for field in SPEC_FIELDS:
        budgets[field].pop("description", None)
        defaults[field].pop("description", None)
    assert budgets == defaults  # one set of rules for both kinds


@pytest.mark.parametrize(
    ("field", "schema_bound", "api_bound"),
    [
        ("budgetGPUMinutes", ("minimum", 0), {"budgetGPUMinutes": -1}),
        ("budgetGPUMinutes", ("maximum", 10**12), {"budgetGPUMinutes": 10**12 + 1}),
        ("maxGPUSharePerPod", ("maximum", 10_000), {"maxGPUSharePerPod": 10_001}),
        ("concurrentGPULimit", ("maximum", 1_000_000), {"concurrentGPULimit": 1_000_001}),
        ("warnAtFraction", ("maximum", 1), {"warnAtFraction": Decimal("1.0001")}),
    ],
)
def test_the_schemas_bounds_are_the_budget_apis(field, schema_bound, api_bound) -> None:
    key, value = schema_bound
    assert _spec_schema("gpubudgets")["properties"][field][key] == value
    with pytest.raises(SpecError):
        budget_in(api_bound)


def test_the_substance_of_a_status_ignores_how_much_was_used_but_not_the_state() -> None:
    """The sync writes a status whose figures alone moved at most every gitops_status_interval_seconds."""
    first = budget_status(_status("10"), applied(REF), 3, None, NOW)
    more = budget_status(_status("20"), applied(REF), 3, first, NOW)
    assert more != first and substance(more) == substance(first)
    warning = budget_status(_status("85", state="warning"), applied(REF), 3, first, NOW)
    assert substance(warning) != substance(first)
    assert substance(budget_status(_status("10"), applied(REF), 4, first, NOW)) != substance(first)


def test_the_forecast_says_when_nothing_will_remain_at_the_recent_rate() -> None:
    forecast = ForecastOut(
        window_minutes=60,
        burn_rate_gpu_minutes_per_hour=Decimal("30.123"),
        exhausts_at=NOW + timedelta(hours=2),
    )
    status = budget_status(_status("40", forecast=forecast), applied(REF), 1, None, NOW)
    assert status["forecast"] == {
        "windowMinutes": 60,
        "burnRateGPUMinutesPerHour": "30.12",
        "exhaustsAt": "2026-03-18T14:00:00Z",
    }


def doc_objects() -> list[dict]:
    """The GPUBudget and GPUBudgetDefault objects docs/gitops.md shows (its ```yaml blocks)."""
    text = (CRDS.parents[2] / "docs" / "gitops.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.DOTALL)
    documents = [d for block in blocks for d in yaml.safe_load_all(block) if d]
    return [d for d in documents if d.get("kind") in ("GPUBudget", "GPUBudgetDefault")]


def test_the_objects_docs_gitops_shows_are_budgets_the_api_takes() -> None:
    objects = doc_objects()
    assert {o["kind"] for o in objects} == {"GPUBudget", "GPUBudgetDefault"}
    for obj in objects:
        assert obj["apiVersion"] == "gpu-timekeeper.io/v1alpha1"
        budget_in(obj["spec"])


def test_the_status_names_the_exhausted_models_and_their_figures() -> None:
    quiet = ModelForecastOut(window_minutes=60, burn_rate_gpu_minutes_per_hour=Decimal(0), exhausts_at=None)
    budget = _status("10").model_copy(
        update={
            "models": {
                "Tesla-T4": ModelBudgetOut(
                    budget_gpu_minutes=Decimal(50),
                    used_gpu_minutes=Decimal(1),
                    remaining_gpu_minutes=Decimal(49),
                    state="in_budget",
                    forecast=quiet,
                ),
                "NVIDIA-H100-80GB-HBM3": ModelBudgetOut(
                    budget_gpu_minutes=Decimal(10),
                    used_gpu_minutes=Decimal(10),
                    remaining_gpu_minutes=Decimal(0),
                    state="exhausted",
                    forecast=quiet,
                ),
            }
        }
    )

    status = budget_status(budget, applied(REF), 3, None, NOW)

    assert status["exhaustedModels"] == ["NVIDIA-H100-80GB-HBM3"]
    assert status["models"]["Tesla-T4"] == {
        "budgetGPUMinutes": "50",
        "usedGPUMinutes": "1",
        "remainingGPUMinutes": "49",
        "state": "in_budget",
    }
    assert "exhaustedModels" not in budget_status(_status("10"), applied(REF), 3, None, NOW)
