"""The node agent's settings: one pydantic-settings class read from `NODEAGENT_*` environment variables."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpuaccounting.podgpus import NODEAGENT_PORT

SERVICEACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="NODEAGENT_", extra="ignore")

    host: str = Field(default="0.0.0.0", description="Address the pod-gpus endpoint listens on.")
    port: int = Field(
        default=NODEAGENT_PORT, ge=1, le=65535, description="Its port (the DaemonSet's hostPort)."
    )
    podresources_socket: Path = Field(
        default=Path("/var/lib/kubelet/pod-resources/kubelet.sock"), description="The kubelet's socket."
    )
    podresources_timeout_seconds: float = Field(default=5.0, gt=0)
    proc_root: Path = Field(
        default=Path("/proc"), description="The host's /proc (the pod runs with hostPID)."
    )
    sample_interval_seconds: float = Field(default=1.0, gt=0, description="How often NVML is read.")
    nvml_library: Path | None = Field(default=None, description="Load this libnvidia-ml.so.1 first.")
    nvml_reinit_seconds: float = Field(
        default=10.0, gt=0, description="Re-initialise NVML this often while a GPU is lost."
    )
    kubernetes_url: str = Field(
        default="https://kubernetes.default.svc", description="The API server (TokenReview)."
    )
    kubernetes_token_file: Path = SERVICEACCOUNT_DIR / "token"
    kubernetes_ca_file: Path | None = Field(
        default=SERVICEACCOUNT_DIR / "ca.crt", description="unset: system CAs."
    )
    token_cache_seconds: float = Field(
        default=60.0, ge=0, description="How long a reviewed token is trusted."
    )
    log_format: Literal["auto", "json", "text"] = "auto"
    log_level: str = "INFO"


@lru_cache
def get_settings() -> Settings:
    return Settings()
