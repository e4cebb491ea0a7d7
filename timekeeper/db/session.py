"""Engine construction and the request-scoped session; the one place that commits or rolls back."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine

from timekeeper.db.embedded import embedded_database_url
from timekeeper.settings import Settings


async def resolve_database_url(settings: Settings) -> str:
    if settings.database_url:
        return settings.database_url
    return await asyncio.to_thread(embedded_database_url, settings.data_dir)


def build_engine(url: str, pool_size: int = 10) -> AsyncEngine:
    """Sessions run in UTC so day and hour buckets never depend on the server's time zone."""
    return create_async_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        connect_args={"options": "-c timezone=UTC"},
    )


def build_sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


async def _session(request: Request) -> AsyncIterator[AsyncSession]:
    async with request.app.state.sessionmaker() as session:
        try:
            yield session
        except BaseException:
            await session.rollback()
            raise
        await session.commit()


# scope="function": the commit happens when the endpoint returns, before the answer is sent, so an
# acknowledged report is a committed one.
SessionDep = Annotated[AsyncSession, Depends(_session, scope="function")]
