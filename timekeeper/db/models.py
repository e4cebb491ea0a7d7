"""Every table, imported in one place so Alembic sees the whole metadata."""

from timekeeper.admission.models import AdmissionVersion, NamespaceStatus
from timekeeper.audit.models import AuditEntry
from timekeeper.budgets.models import DefaultBudget, Grant, NamespaceBudget, UsageTotal
from timekeeper.db.base import Base
from timekeeper.scheduler.models import BudgetEvent, JobRun, UsageHourly
from timekeeper.usage.models import LedgerEntry, PodCoverage

__all__ = [
    "AdmissionVersion",
    "AuditEntry",
    "Base",
    "BudgetEvent",
    "DefaultBudget",
    "Grant",
    "JobRun",
    "LedgerEntry",
    "NamespaceBudget",
    "NamespaceStatus",
    "PodCoverage",
    "UsageHourly",
    "UsageTotal",
]
