"""The schema comes from the migrations, and the migrations match the models."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.engine import URL

from tests.support.postgres import create_database, drop_database, url_string
from tests.support.timekeeper import migrate
from timekeeper.db.models import Base


@pytest.fixture
def engine(database_url: URL) -> Iterator[sa.Engine]:
    engine = sa.create_engine(url_string(database_url), poolclass=sa.NullPool)
    yield engine
    engine.dispose()


def drift(engine: sa.Engine, metadata: sa.MetaData) -> list:
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return compare_metadata(context, metadata)


def test_the_models_and_the_migrations_agree(engine: sa.Engine) -> None:
    assert drift(engine, Base.metadata) == []


def test_the_drift_check_notices_a_model_change(engine: sa.Engine) -> None:
    changed = sa.MetaData(naming_convention=Base.metadata.naming_convention)
    for table in Base.metadata.sorted_tables:
        table.to_metadata(changed)
    changed.tables["grants"].append_column(sa.Column("colour", sa.Text()))

    assert [diff[0] for diff in drift(engine, changed)] == ["add_column"]


def test_the_migration_seeds_the_default_budget_and_the_snapshot_version(engine: sa.Engine) -> None:
    with engine.connect() as connection:
        default = connection.execute(sa.text("SELECT budget_gpu_minutes, period FROM default_budget")).one()
        version = connection.execute(sa.text("SELECT version FROM admission_version")).scalar_one()

    assert (default.budget_gpu_minutes, default.period, version) == (None, "monthly", 1)


def test_the_migrations_go_down_and_up_again() -> None:
    url = create_database("gtk_migrations")
    try:
        migrate(url)
        migrate(url, "base")
        engine = sa.create_engine(url_string(url), poolclass=sa.NullPool)
        with engine.connect() as connection:
            assert sa.inspect(connection).get_table_names() == ["alembic_version"]
        migrate(url)
        with engine.connect() as connection:
            assert "usage_ledger" in sa.inspect(connection).get_table_names()
        engine.dispose()
    finally:
        drop_database(url)
