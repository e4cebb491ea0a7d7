"""Whatever the network and sidecar restarts do to the reports, the charge equals the ground truth."""

from __future__ import annotations

import random
from datetime import timedelta
from decimal import Decimal

import pytest

from tests.support.timekeeper import Api, ok
from tests.timekeeper.conftest import START

pytestmark = pytest.mark.asyncio(loop_scope="session")

INTERVAL = timedelta(seconds=30)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_retries_reordering_and_restarts_charge_the_ground_truth_exactly(api: Api, seed: int) -> None:
    rng = random.Random(seed)
    first = START - timedelta(hours=3)
    pods = {f"pod-{index}": Decimal(rng.choice(["0.125", "0.5", "1", "2"])) for index in range(3)}
    sends: list[dict] = []
    truth = Decimal(0)
    for pod, share in pods.items():
        intervals = rng.randint(20, 40)
        truth += share * intervals * Decimal(INTERVAL.total_seconds()) / 60
        seq = 0
        for index in range(intervals):
            start = first + index * INTERVAL
            fields = dict(
                pod=pod, pod_uid=f"uid-{pod}", start=start, end=start + INTERVAL, gpu_share=float(share)
            )
            sends.append({**fields, "seq": seq})
            if rng.random() < 0.3:  # a retry after a lost acknowledgement
                sends.append({**fields, "seq": seq})
            if rng.random() < 0.1:  # a restart: numbering begins again, the last minutes are sent again
                seq = 0
                for back in range(min(rng.randint(1, 3), index + 1)):
                    again = start - back * INTERVAL
                    sends.append({**fields, "seq": seq, "start": again, "end": again + INTERVAL})
                    seq += 1
            seq += 1
    rng.shuffle(sends)  # arbitrary arrival order

    charged = Decimal(0)
    for send in sends:
        charged += Decimal(str(ok(await api.report(**send))["gpu_minutes"]))

    assert charged == truth
    assert Decimal(str((await api.budget("team-a"))["used_gpu_minutes"])) == truth
