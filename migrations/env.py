"""Alembic environment: the URL comes from the caller (config.attributes["database_url"]), else from
TIMEKEEPER_DATABASE_URL, else the embedded PostgreSQL the timekeeper itself would use."""

from __future__ import annotations

from logging.config import fileConfig

import sqlalchemy as sa
from alembic import context

from timekeeper.audit import models as audit
from timekeeper.billing import models as billing
from timekeeper.budgets import models as budgets
from timekeeper.budgets.managed import models as managed
from timekeeper.budgets.pools import models as pools
from timekeeper.budgets.states import models as states
from timekeeper.db.base import Base
from timekeeper.db.embedded import embedded_database_url
from timekeeper.periodic import models as periodic
from timekeeper.settings import Settings, normalise_database_url
from timekeeper.usage import models as usage

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logging", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

# Every domain's models, gathered here (not in timekeeper/db/, which the domains build on): importing a
# models module registers its tables on Base.metadata, the schema autogenerate and `alembic check` compare.
MODELS = (audit, billing, budgets, managed, periodic, pools, states, usage)
target_metadata = Base.metadata


def database_url() -> str:
    given = config.attributes.get("database_url")
    if given:
        return normalise_database_url(str(given))
    settings = Settings()
    return settings.database_url or embedded_database_url(settings.data_dir)


def include_name(name: str | None, type_: str, parent_names: object) -> bool:
    """The ledger's partitions (usage/partitions.py) are made at run time, not models."""
    return not (type_ == "table" and name is not None and name.startswith("usage_ledger_"))


def run_migrations_offline() -> None:
    context.configure(
        url=database_url(), target_metadata=target_metadata, literal_binds=True, include_name=include_name
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = sa.create_engine(database_url(), poolclass=sa.NullPool)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            compare_type=True,
            include_name=include_name,
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
