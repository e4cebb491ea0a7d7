"""What a report may decide of its own charge (issue 37, point 6). In Kubernetes auth mode a report carries
its pod's token, which a tenant who reached the token would hold: neither the GPU it names nor the
utilisation it states lowers the charge. The pod's model is its node's (given by the report path, which
reads the node's GPU Feature Discovery label); a pod whose node does not say counts 1, as an unknown model
does. In static auth mode reporter tokens are an admin's, and both are believed as before."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from tests.support.timekeeper import report_body
from tests.timekeeper.conftest import START
from timekeeper.billing.repository import BillingRepository
from timekeeper.settings import Settings
from timekeeper.usage.schemas import ReportIn
from timekeeper.usage.service import IngestService

pytestmark = pytest.mark.asyncio(loop_scope="session")

H100 = "NVIDIA-H100-80GB-HBM3"
T4 = "Tesla T4"  # NVML's spelling, as a forged report names it
MINUTES = 5


@pytest.fixture
def sessionmaker(connection: AsyncConnection) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(
        bind=connection, expire_on_commit=False, join_transaction_mode="create_savepoint"
    )


@pytest.fixture
def kubernetes(settings: Settings) -> Settings:
    return settings.model_copy(update={"auth_mode": "kubernetes"})


@pytest.fixture
async def weighted(sessionmaker: async_sessionmaker[AsyncSession]) -> None:
    """An H100 minute counts 3, a T4 minute 0.5; the cluster charges by measured use, floor 0.1."""
    async with sessionmaker() as session, session.begin():
        billing = BillingRepository(session)
        await billing.set_weight(H100, Decimal(3), START - timedelta(days=1), "admin")
        await billing.set_weight("Tesla-T4", Decimal("0.5"), START - timedelta(days=1), "admin")
        await billing.set_basis("*", "measured", Decimal("0.1"), "admin", START - timedelta(days=1))


def forged(pod: str, seq: int = 1, name: str = T4, util: float = 100.0) -> ReportIn:
    """Minutes of a pod naming GPU `name` at `util` % (100: the measured basis charges the allocation)."""
    gpus: list[dict[str, Any]] = [
        {"uuid": "GPU-0", "sm_util_pct": util, "mem_used_bytes": 1, "mem_total_bytes": 2, "name": name}
    ]
    start = START - timedelta(minutes=60 - MINUTES * seq)
    body = report_body(pod=pod, pod_uid=f"uid-{pod}", seq=seq, start=start, minutes=MINUTES, gpus=gpus)
    return ReportIn.model_validate(body)


async def charged(
    sessionmaker: async_sessionmaker[AsyncSession],
    settings: Settings,
    report: ReportIn,
    model: str | None = None,
) -> Decimal:
    """The report's charge; `model`: the node's, as the report path reads it for a pod's first report."""
    async with sessionmaker() as session, session.begin():
        outcome = await IngestService(session, settings).charge_one(
            report, START, gpu_model=model, admitted_share=Decimal(1)
        )
    return outcome.gpu_minutes


@pytest.mark.usefixtures("weighted")
async def test_a_pod_is_weighted_by_its_nodes_model_whatever_gpu_its_reports_name(
    sessionmaker: async_sessionmaker[AsyncSession], kubernetes: Settings
) -> None:
    """The issue's numbers: a forged "Tesla T4" first report made an H100 pod cost 0.86 against 4.49."""
    assert (
        await charged(sessionmaker, kubernetes, forged("control", name="NVIDIA H100 80GB HBM3"), H100) == 15
    )
    assert await charged(sessionmaker, kubernetes, forged("forger"), H100) == 15
    assert await charged(sessionmaker, kubernetes, forged("forger", seq=2)) == 15  # the node's model is kept
    # A node without the label: the pod counts 1 (an unknown model), never the cheaper model it names.
    assert await charged(sessionmaker, kubernetes, forged("unlabelled")) == MINUTES


@pytest.mark.usefixtures("weighted")
async def test_a_report_at_no_utilisation_is_charged_its_allocation_unless_reports_are_trusted(
    sessionmaker: async_sessionmaker[AsyncSession], kubernetes: Settings
) -> None:
    """The measured basis with a pod's token: 0 % was charged 0.23 against its control's 2.18. Only an admin
    who trusts the sidecar's figures (TIMEKEEPER_TRUST_REPORTED_UTILISATION) lets them lower the charge."""
    trusting = kubernetes.model_copy(update={"trust_reported_utilisation": True})

    assert await charged(sessionmaker, kubernetes, forged("control", name=H100), H100) == 15
    assert await charged(sessionmaker, kubernetes, forged("idle", name=H100, util=0.0), H100) == 15
    assert await charged(sessionmaker, trusting, forged("trusted", name=H100, util=0.0), H100) == Decimal(
        "1.5"
    )


@pytest.mark.usefixtures("weighted")
async def test_in_static_mode_a_report_names_its_model_and_its_utilisation_counts(
    sessionmaker: async_sessionmaker[AsyncSession], settings: Settings
) -> None:
    """Static reporter tokens are an admin's (docs/timekeeper.md): what they report is believed."""
    assert await charged(sessionmaker, settings, forged("t4")) == Decimal("2.5")
    assert await charged(sessionmaker, settings, forged("idle-t4", util=0.0)) == Decimal("0.25")


@pytest.mark.usefixtures("weighted")
async def test_a_models_minutes_are_the_nodes_model_and_raw_whatever_a_report_or_silence_says(
    sessionmaker: async_sessionmaker[AsyncSession], kubernetes: Settings
) -> None:
    """Per-model budgets (issue 41) count the node's model: a report naming a T4 on an H100 node, and the
    reconcile pass's charge of silent time (from_sidecar=False, through the same IngestService.charge),
    both count raw minutes under the H100, in the charge's transaction."""
    await charged(sessionmaker, kubernetes, forged("forger"), H100)
    async with sessionmaker() as session, session.begin():
        await IngestService(session, kubernetes).charge_one(
            forged("forger", seq=2), START, from_sidecar=False, gpu_model=H100, admitted_share=Decimal(1)
        )
        result = await session.execute(
            sa.text("SELECT model, sum(used_gpu_minutes) FROM usage_model_totals GROUP BY model")
        )
        used = {model: amount for model, amount in result.all()}
    assert used == {H100: 2 * MINUTES}
