"""Budgets per GPU model: budgets, the default and pools gain `models` (a JSON object from a model to its
GPU-minutes) and `model_policy`; usage_model_totals keeps the raw GPU-minutes per namespace, period and
model, and usage_model_burn their 5-minute burn buckets, maintained by each charge from now on (charges
made before count under no model: a period begun before the upgrade shows less per-model use than was
charged); namespace_status keeps each model's state; a budget event may name its model.

Revision ID: 5b8e2d1c7a40
Revises: 9a4c6e2f1b37
Create Date: 2026-12-07 06:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "5b8e2d1c7a40"
down_revision: str | None = "9a4c6e2f1b37"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BUDGET_TABLES = ("namespace_budgets", "default_budget", "budget_pools")


def upgrade() -> None:
    for table in _BUDGET_TABLES:
        op.add_column(table, sa.Column("models", JSONB(), nullable=True))
        op.add_column(table, sa.Column("model_policy", sa.Text(), server_default="reduce", nullable=False))
        op.create_check_constraint(
            op.f(f"ck_{table}_models_object"), table, "models IS NULL OR jsonb_typeof(models) = 'object'"
        )
        op.create_check_constraint(
            op.f(f"ck_{table}_model_policy"), table, "model_policy IN ('reduce', 'steer')"
        )
    op.create_table(
        "usage_model_totals",
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("period_kind", sa.Text(), nullable=False),
        sa.Column("period_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("used_gpu_minutes", sa.Numeric(24, 9), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint(
            "namespace", "period_kind", "period_start", "model", name=op.f("pk_usage_model_totals")
        ),
    )
    op.create_table(
        "usage_model_burn",
        sa.Column("namespace", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=False),
        sa.Column("bucket_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("gpu_minutes", sa.Numeric(24, 9), nullable=False),
        sa.PrimaryKeyConstraint("namespace", "model", "bucket_start", name=op.f("pk_usage_model_burn")),
    )
    op.add_column(
        "namespace_status",
        sa.Column("model_states", JSONB(), server_default=sa.text("'{}'::jsonb"), nullable=False),
    )
    op.add_column("budget_events", sa.Column("model", sa.Text(), nullable=True))
    # One event for the total's change, and one for each model whose state changed (appeared: old NULL).
    op.execute(
        """
        CREATE OR REPLACE FUNCTION record_budget_event() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'INSERT' OR NEW.state IS DISTINCT FROM OLD.state THEN
                INSERT INTO budget_events (namespace, old_state, new_state)
                VALUES (NEW.namespace, CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END, NEW.state);
            END IF;
            IF TG_OP = 'INSERT' OR NEW.model_states IS DISTINCT FROM OLD.model_states THEN
                INSERT INTO budget_events (namespace, old_state, new_state, model)
                SELECT NEW.namespace, CASE WHEN TG_OP = 'UPDATE' THEN OLD.model_states ->> n.key END,
                    n.value, n.key
                FROM jsonb_each_text(NEW.model_states) AS n
                WHERE TG_OP = 'INSERT' OR (OLD.model_states ->> n.key) IS DISTINCT FROM n.value
                ORDER BY n.key;
            END IF;
            RETURN NULL;
        END
        $$
        """
    )
    op.execute("DROP TRIGGER namespace_status_budget_events ON namespace_status")
    op.execute(
        "CREATE TRIGGER namespace_status_budget_events AFTER INSERT OR UPDATE OF state, model_states "
        "ON namespace_status FOR EACH ROW EXECUTE FUNCTION record_budget_event()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER namespace_status_budget_events ON namespace_status")
    op.execute(
        """
        CREATE OR REPLACE FUNCTION record_budget_event() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'INSERT' OR NEW.state IS DISTINCT FROM OLD.state THEN
                INSERT INTO budget_events (namespace, old_state, new_state)
                VALUES (NEW.namespace, CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END, NEW.state);
            END IF;
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        "CREATE TRIGGER namespace_status_budget_events AFTER INSERT OR UPDATE OF state ON namespace_status "
        "FOR EACH ROW EXECUTE FUNCTION record_budget_event()"
    )
    op.execute("DELETE FROM budget_events WHERE model IS NOT NULL")
    op.drop_column("budget_events", "model")
    op.drop_column("namespace_status", "model_states")
    op.drop_table("usage_model_burn")
    op.drop_table("usage_model_totals")
    for table in _BUDGET_TABLES:
        op.drop_constraint(op.f(f"ck_{table}_model_policy"), table, type_="check")
        op.drop_constraint(op.f(f"ck_{table}_models_object"), table, type_="check")
        op.drop_column(table, "model_policy")
        op.drop_column(table, "models")
