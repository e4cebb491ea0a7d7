"""SQL for the namespaces' stored states and the admission snapshot's version."""

from __future__ import annotations

import json
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from gpuaccounting.admission_state import NamespaceAdmission, PriorityClassNames
from gpuaccounting.wire import BudgetState

# Inserts a namespace on first sight; touches an existing row only when its state really changes, and
# then reports it (RETURNING yields a row for an insert or a real update, none otherwise).
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
            sa.text(
                "SELECT namespace, state FROM namespace_status "
                "WHERE namespace = ANY(CAST(:namespaces AS text[]))"
            ),
            {"namespaces": namespaces},
        )
        return dict(result.tuples().all())

    async def bump_version(self) -> int:
        """Called in the transaction that changed a state or a budget, so the new version and the change
        become visible together."""
        result = await self.session.execute(
            sa.text("UPDATE admission_version SET version = version + 1 RETURNING version")
        )
        return int(result.scalar_one())

    async def version(self) -> tuple[int, datetime]:
        row = (
            await self.session.execute(sa.text("SELECT version, refreshed_for FROM admission_version"))
        ).one()
        return int(row.version), row.refreshed_for

    async def mark_refreshed(self, day: datetime) -> None:
        """Taken after the states' rows (the lock order every writer follows: states, then version)."""
        await self.session.execute(
            sa.text("UPDATE admission_version SET refreshed_for = greatest(refreshed_for, :day)"),
            {"day": day},
        )

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
