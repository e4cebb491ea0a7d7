"""The watches the leader keeps between passes and the caches they fill: pods (a PodRegistry), GPU claims
(a ClaimRegistry) and Kueue's Workloads (KueuePriorities lowers them as they change). Tasks on the
event loop, started and cancelled with leadership."""

from __future__ import annotations

import asyncio
import logging
from contextlib import aclosing

from timekeeper.clock import Clock
from timekeeper.kube import KubeClient, KubeError, KubeUnavailableError
from timekeeper.kube.core import DRA_GROUP
from timekeeper.reconcile.claims import ClaimRegistry
from timekeeper.reconcile.kueue import KueuePriorities
from timekeeper.reconcile.pods import PodRegistry
from timekeeper.settings import Settings

log = logging.getLogger(__name__)


class Watches:
    """The pod, claim and Workload watches, and the registries the passes read."""

    def __init__(self, kube: KubeClient, settings: Settings, clock: Clock, kueue: KueuePriorities) -> None:
        self.kube = kube
        self.settings = settings
        self.kueue = kueue
        self.pods = PodRegistry(clock, settings.hardware)
        self.claims = ClaimRegistry()
        self._pods_watch: asyncio.Task[None] | None = None
        self._claims_watch: asyncio.Task[None] | None = None
        self._kueue_watch: asyncio.Task[None] | None = None

    @property
    def watching(self) -> bool:
        return self._pods_watch is not None and not self._pods_watch.done()

    def start(self) -> None:
        """Emptied registries, filled by the watches' first lists and kept current by them."""
        self.pods.reset()
        self.claims.reset()
        self._pods_watch = asyncio.create_task(self._follow_pods(), name="pod-watch")
        self._claims_watch = asyncio.create_task(self._follow_claims(), name="claims-watch")
        self._kueue_watch = asyncio.create_task(self.kueue.follow(), name="kueue-watch")

    async def stop(self) -> None:
        """Cancel the watches: their open requests end with the tasks, nothing is left waiting."""
        watches = [w for w in (self._pods_watch, self._claims_watch, self._kueue_watch) if w is not None]
        self._pods_watch = self._claims_watch = self._kueue_watch = None
        for watch in watches:
            watch.cancel()
        await asyncio.gather(*watches, return_exceptions=True)

    async def _follow_pods(self) -> None:
        try:
            async with aclosing(self.kube.watch_pods(timeout_seconds=300)) as stream:
                async for item in stream:
                    self.pods.apply(item)
        except Exception:
            log.exception("pod_watch_crashed")
            raise

    async def _follow_claims(self) -> None:
        """Between passes, the claims as they change (one made and deleted between two passes included),
        once discovery finds resource.k8s.io (asked again each reconcile interval until then)."""
        version = None
        while version is None:
            try:
                version = await self.kube.dra_version()
            except KubeError as error:
                log.warning("claims_discovery_failed", extra={"error": str(error)})
            if version is None:
                await asyncio.sleep(self.settings.reconcile_interval_seconds)
        try:
            async with aclosing(self.kube.watch_custom_raw(DRA_GROUP, version, "resourceclaims")) as stream:
                async for _, claim in stream:
                    self.claims.observe(claim)
        except Exception:
            log.exception("claims_watch_crashed")  # the passes' lists still see every claim that lasts
            raise

    async def wait_synced(self) -> None:
        """Before a pass: the registry must hold a full list (a new leader's watch has just started). Its
        leadership may be lost and taken again meanwhile: then the new watch's list is the one awaited."""
        timeout = self.settings.reconcile_interval_seconds
        try:
            async with asyncio.timeout(timeout):
                while not self.pods.synced.is_set():
                    await self.pods.synced.wait()
        except TimeoutError:
            raise KubeUnavailableError(f"the pod watch has not listed the pods within {timeout} s") from None
