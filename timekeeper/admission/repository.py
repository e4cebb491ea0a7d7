"""SQL for the namespaces' stored states and the admission snapshot's version."""

from __future__ import annotations

import json
from typing import cast

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from gpuaccounting.admission_state import NamespaceAdmission, PriorityClassNames
from gpuaccounting.wire import BudgetState
from timekeeper.admission.models import AdmissionVersion, NamespaceStatus

# Inserts a namespace on first sight; touches an existing row only when its state really changes, and
# then reports it (RETURNING yields a row for an insert or a real update, none otherwise). Two arrays,
# unnested: one statement of constant size whether a report restates one namespace or a sweep 10,000.
_SET_STATES = sa.text(
    "INSERT INTO namespace_status (namespace, state) "
    "SELECT * FROM unnest(CAST(:namespaces AS text[]), CAST(:states AS text[])) "
    "ON CONFLICT (namespace) DO UPDATE SET state = excluded.state "
    "WHERE namespace_status.state <> excluded.state RETURNING namespace"
)
_SNAPSHOT = sa.text(
    """
    SELECT json_build_object(
        'version', CAST(:version AS bigint),
        'generated_at', CAST(:generated_at AS text),
        'priority_classes', CAST(:priority_classes AS json),
        'default', CAST(:default AS json),
        'namespaces', coalesce((
            SELECT json_object_agg(s.namespace, json_build_object(
                'state', s.state,
                'max_gpu_share_per_pod', CAST(CASE WHEN b.namespace IS NULL THEN d.max_gpu_share_per_pod
                                                   ELSE b.max_gpu_share_per_pod END AS float8),
                'priority_policy', CAST(coalesce(b.priority_policy, d.priority_policy) AS json)))
            FROM namespace_status s
            CROSS JOIN default_budget d
            LEFT JOIN namespace_budgets b ON b.namespace = s.namespace
        ), CAST('{}' AS json))
    )::text
    """
)


class AdmissionRepository:
    def __init__(self, session: AsyncSession) -> None:
        self.session = session

    async def set_states(self, states: dict[str, BudgetState]) -> set[str]:
        """Record namespaces' states (in key order, the lock order); answers those new or changed (when
        any, the snapshot needs a new version)."""
        if not states:
            return set()
        names = sorted(states)
        result = await self.session.execute(
            _SET_STATES, {"namespaces": names, "states": [states[name] for name in names]}
        )
        return set(result.scalars())

    async def stored_states(self, namespaces: list[str]) -> dict[str, BudgetState]:
        if not namespaces:
            return {}
        result = await self.session.execute(
            sa.select(NamespaceStatus.namespace, NamespaceStatus.state).where(
                NamespaceStatus.namespace.in_(namespaces)
            )
        )
        return {namespace: cast(BudgetState, state) for namespace, state in result.tuples()}

    async def bump_version(self) -> int:
        """Called in the transaction that changed a state or a budget, so the new version and the change
        become visible together."""
        result = await self.session.execute(
            sa.update(AdmissionVersion)
            .values(version=AdmissionVersion.version + 1)
            .returning(AdmissionVersion.version)
        )
        return int(result.scalar_one())

    async def version(self) -> int:
        result = await self.session.execute(sa.select(AdmissionVersion.version))
        return int(result.scalar_one())

    async def snapshot_json(
        self,
        *,
        version: int,
        generated_at: str,
        priority_classes: PriorityClassNames,
        default: NamespaceAdmission,
    ) -> str:
        result = await self.session.execute(
            _SNAPSHOT,
            {
                "version": version,
                "generated_at": generated_at,
                "priority_classes": json.dumps(priority_classes),
                "default": json.dumps(default),
            },
        )
        return str(result.scalar_one())
