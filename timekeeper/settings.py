"""The timekeeper's settings: one pydantic-settings class read from `TIMEKEEPER_*` environment variables."""

from __future__ import annotations

from datetime import timedelta
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AwareDatetime, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from gpuaccounting.names import DEFAULT_IN_BUDGET_PRIORITY_CLASS, DEFAULT_OVER_BUDGET_PRIORITY_CLASS

TokenDigests = Annotated[tuple[str, ...], NoDecode]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TIMEKEEPER_", extra="ignore")

    database_url: str | None = Field(
        default=None,
        description="PostgreSQL URL; when unset an embedded PostgreSQL is started in data_dir.",
    )
    data_dir: Path = Field(default=Path(".timekeeper-data"), description="Embedded PostgreSQL's data folder.")
    database_pool_size: int = Field(default=10, ge=1)

    auth_mode: Literal["static", "kubernetes"] = "static"
    admin_token_sha256: TokenDigests = ()
    reporter_token_sha256: TokenDigests = ()
    reader_token_sha256: TokenDigests = ()
    anonymous_read: bool = False

    in_budget_priority_class: str = DEFAULT_IN_BUDGET_PRIORITY_CLASS
    over_budget_priority_class: str = DEFAULT_OVER_BUDGET_PRIORITY_CLASS

    clock_skew: timedelta = Field(
        default=timedelta(seconds=60), description="How far in the future a report may end."
    )
    max_report_interval: timedelta = Field(
        default=timedelta(hours=1), description="Longest accepted interval."
    )
    max_gpu_share: float = Field(default=256.0, gt=0, description="Largest believable GPU share of one pod.")
    max_body_bytes: int = Field(default=64 * 1024, ge=1024, description="Largest accepted request body.")

    log_format: Literal["auto", "json", "text"] = Field(
        default="auto", description="Log lines as JSON or text; auto is JSON unless stderr is a terminal."
    )
    log_level: str = "INFO"

    clock_start: AwareDatetime | None = Field(default=None, description="Demo clock: the time it starts at.")
    clock_speed: float = Field(
        default=1.0, gt=0, description="Demo clock: simulated seconds per real second."
    )

    @field_validator("admin_token_sha256", "reporter_token_sha256", "reader_token_sha256", mode="before")
    @classmethod
    def _split_digests(cls, value: object) -> object:
        """Comma-separated hex digests; a malformed one fails at start rather than never matching."""
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list | tuple):
            digests = tuple(str(part).lower() for part in value)
            for digest in digests:
                if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                    raise ValueError("token digests must be 64 hex characters (SHA-256)")
            return digests
        return value

    @field_validator("clock_skew", "max_report_interval", mode="before")
    @classmethod
    def _seconds(cls, value: object) -> object:
        """Durations as plain seconds ("90") or ISO 8601 ("PT10M")."""
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                return value
        return value

    @field_validator("database_url")
    @classmethod
    def _normalise_url(cls, value: str | None) -> str | None:
        return normalise_database_url(value) if value else None


def normalise_database_url(url: str) -> str:
    """Every PostgreSQL URL goes through psycopg 3, which serves both the sync and the async engine."""
    for prefix in ("postgresql://", "postgres://", "postgresql+psycopg2://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


@lru_cache
def get_settings() -> Settings:
    """The process's settings, read once; tests build their own Settings instead."""
    return Settings()
