"""Silent time charged through the report path (`IngestService.charge_one`), so reports and passes never
charge the same time twice: pods no report covered (up to the grace, or their real end, once), and each
allocated GPU claim once whatever the number of its pods (docs/timekeeper.md, "DRA claims"). A member
cluster's pods are charged under their namespace and pod keys, as their sidecars' reports are
(`keyed`, docs/fleet.md)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from decimal import Decimal
from http import HTTPStatus

from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from timekeeper.clock import Clock
from timekeeper.domain.clusters import namespace_key
from timekeeper.domain.periods import Interval
from timekeeper.errors import TimekeeperError
from timekeeper.kube import KubeClient, KubeError
from timekeeper.reconcile.claims import (
    CLAIM_POD_PREFIX,
    ClaimConsumers,
    ClaimPart,
    ClaimRegistry,
    TrackedClaim,
    ran,
)
from timekeeper.reconcile.pods import PodRegistry, TrackedPod
from timekeeper.reconcile.repository import ReconcileRepository
from timekeeper.reconcile.result import PassResult
from timekeeper.settings import Settings
from timekeeper.usage.admitted import NodeModels
from timekeeper.usage.router import keyed
from timekeeper.usage.schemas import SilentInterval
from timekeeper.usage.service import IngestService

log = logging.getLogger(__name__)

# A sequence number no sidecar reaches; coverage, not the number, is what prevents double charging.
RECONCILER_SEQ = 2**62


class SilentCharger:
    """The pass's charges; `claim_holders`: the pods using a GPU claim, as the last claims charge found."""

    def __init__(
        self,
        kube: KubeClient,
        registry: PodRegistry,
        claims: ClaimRegistry,
        sessionmaker: async_sessionmaker[AsyncSession],
        settings: Settings,
        clock: Clock,
        node_models: NodeModels,
        cluster: str | None = None,
    ) -> None:
        self.kube = kube
        self.cluster = cluster  # whose pods and claims these are (None: the local cluster)
        self.registry = registry
        self.claims = claims
        self.sessionmaker = sessionmaker
        self.settings = settings
        self.clock = clock
        self.node_models = node_models
        self.claim_holders: set[str] = set()  # uids of the pods using a GPU claim (the last pass's)
        self._skipped: set[str] = set()  # uids whose silent time could not be charged (logged once)

    def forget(self) -> None:
        self.claim_holders = set()
        self._skipped = set()

    async def charge_pods(self, result: PassResult) -> None:
        """Charge what no report covered: ended pods up to their real end (once), running pods up to the
        grace. Only pods with uncharged time in that span are touched."""
        now = self.clock.now()
        until = now - timedelta(seconds=self.settings.silent_grace_seconds)
        spans: dict[str, tuple[TrackedPod, datetime, datetime, bool]] = {}
        for pod in self.registry.pods():
            start = pod.info.started_at
            if pod.closed:
                continue
            if start is None:
                if pod.ended_at is not None:  # never started: nothing to charge, nothing to remember
                    self.registry.mark_closed(pod.info.uid)
                continue
            if pod.ended_at is not None:
                spans[pod.info.uid] = (pod, start, pod.ended_at, True)
            elif pod.running and until > start:
                spans[pod.info.uid] = (pod, start, until, False)
        async with self.sessionmaker() as session:
            # A pod with no GPUs outside its claims has nothing to charge (its claims' charge has its time).
            uncovered = await ReconcileRepository(session, self.cluster).with_uncovered_time(
                (uid, start, end) for uid, (pod, start, end, _) in spans.items() if end > start and pod.share
            )
        for uid, (pod, start, end, final) in spans.items():
            if uid in uncovered:
                result.charged[uid] = await self._charge_pod(pod, start, end, final, now)
            elif final:
                async with self.sessionmaker() as session, session.begin():
                    await ReconcileRepository(session, self.cluster).close_at(uid, end)
            if final:
                self.registry.mark_closed(uid)
                result.closed.append(uid)

    async def charge_claims(self, result: PassResult) -> None:
        """Each allocated GPU claim once, whatever the number of its pods, for the time they ran (up to the
        grace), through the report path (docs/timekeeper.md, "DRA claims"). A claim gone from the API whose
        consumers have all ended is closed at their end and forgotten."""
        try:
            version = await self.kube.dra_version()
            if version is None:
                return
            claims = await self.kube.list_dra_objects(version, "resourceclaims")
            slices = await self.kube.list_dra_objects(version, "resourceslices")
        except KubeError as error:
            log.warning("claims_unavailable", extra={"error": str(error)})
            return
        self.claims.update(claims, slices, self.settings.hardware)
        now = self.clock.now()
        until = now - timedelta(seconds=self.settings.silent_grace_seconds)
        consumers = ClaimConsumers(self.registry.pods(), self.settings.hardware.catalogue)
        holders: set[str] = set()
        plans: list[tuple[TrackedClaim, ClaimPart, list[Interval], bool]] = []
        finished: list[str] = []  # forgotten once their final charge is committed
        for uid, claim in self.claims.claims().items():
            users = consumers.of(claim)
            holders.update(pod.info.uid for pod in users)
            final = not claim.listed and all(pod.ended_at is not None for pod in users)
            if final:
                finished.append(uid)
            if consumers.charged_to_pods(claim, users):
                continue  # the scheduler's claim for extended resources its pods' shares count
            spans = ran(users, until)
            plans.extend((claim, part, spans, final) for part in claim.parts if spans)
        self.claim_holders = holders
        flat = [(part.key, start, end) for _, part, spans, _ in plans for start, end in spans]
        async with self.sessionmaker() as session:
            uncovered = await ReconcileRepository(session, self.cluster).uncovered_spans(flat)
        first = 0
        for claim, part, spans, final in plans:
            mine = [index - first for index in range(first, first + len(spans)) if index in uncovered]
            first += len(spans)
            if mine or final:
                minutes = await self._charge_claim_part(claim, part, spans, mine, final, now)
                if mine:
                    result.claims_charged[part.key] = minutes
        for uid in finished:
            self.claims.forget(uid)

    async def _charge_claim_part(
        self,
        claim: TrackedClaim,
        part: ClaimPart,
        spans: list[Interval],
        uncovered: list[int],
        final: bool,
        now: datetime,
    ) -> Decimal:
        """Charge one part of a claim for its spans holding uncharged time (`uncovered`, their positions),
        one charge each at the part's share and model; `final`: then closed at the last span's end."""
        async with self.sessionmaker() as session, session.begin():
            repository = ReconcileRepository(session, self.cluster)
            charged = Decimal(0)
            for index in uncovered:
                start, end = spans[index]
                try:
                    report = keyed(
                        self.cluster,
                        SilentInterval(
                            namespace=claim.namespace,
                            pod=f"{CLAIM_POD_PREFIX}{claim.name}"[:253],
                            pod_uid=part.key,
                            seq=RECONCILER_SEQ,
                            interval_start=start,
                            interval_end=end,
                            gpu_share=part.share,
                            final=final and index == len(spans) - 1,
                        ),
                    )
                except ValidationError as error:
                    log.warning(
                        "reconcile_claim_skipped",
                        extra={
                            "namespace": self._key(claim.namespace),
                            "claim": claim.name,
                            "error": str(error),
                        },
                    )
                    return charged
                outcome = await IngestService(session, self.settings).charge_one(
                    report, now, from_sidecar=False, gpu_model=part.model, admitted_share=part.share
                )
                charged += outcome.gpu_minutes
            if final:
                await repository.close_at(part.key, spans[-1][1])
        if uncovered:
            log.info(
                "claim_time_charged",
                extra={
                    "namespace": self._key(claim.namespace),
                    "claim": claim.name,
                    "gpu_minutes": float(charged),
                    "final": final,
                },
            )
        return charged

    async def _charge_pod(
        self, pod: TrackedPod, start: datetime, end: datetime, final: bool, now: datetime
    ) -> Decimal:
        """Charge [start, end] minus what is covered at the pod's admitted share, as a report would, in one
        transaction that leaves the pod's last report time alone and, for an ended pod, closes it at its
        end. A pod whose time cannot be charged is logged once, with the reason."""
        info = pod.info
        model = await self.node_models.model(info.node_name) if info.node_name else None
        try:
            report = keyed(
                self.cluster,
                SilentInterval(
                    namespace=info.namespace,
                    pod=info.name,
                    pod_uid=info.uid,
                    seq=RECONCILER_SEQ,
                    interval_start=start,
                    interval_end=end,
                    gpu_share=pod.share,
                    final=final,
                ),
            )
            async with self.sessionmaker() as session, session.begin():
                outcome = await IngestService(session, self.settings).charge_one(
                    report, now, from_sidecar=False, gpu_model=model, admitted_share=pod.share
                )
                if final:
                    await ReconcileRepository(session, self.cluster).close_at(info.uid, end)
        except (ValidationError, TimekeeperError) as error:
            # Not chargeable, or its uid is another namespace's pod's (409: a member's API server may name
            # any uid): the pass goes on with the other pods. Anything else fails the pass, retried next.
            if isinstance(error, TimekeeperError) and error.status_code != HTTPStatus.CONFLICT:
                raise
            if info.uid not in self._skipped:
                self._skipped.add(info.uid)
                log.warning(
                    "reconcile_pod_skipped",
                    extra={"namespace": self._key(info.namespace), "pod": info.name, "error": str(error)},
                )
            return Decimal(0)
        log.info(
            "silent_time_charged",
            extra={
                "namespace": report.namespace,
                "pod": info.name,
                "gpu_minutes": float(outcome.gpu_minutes),
                "final": final,
            },
        )
        return outcome.gpu_minutes

    def _key(self, namespace: str) -> str:
        return namespace_key(self.cluster, namespace)
