"""Sidecar settings, parsed from the environment the webhook injects, with the standard library only: a
boolean accepts true/false/1/0/yes/no/on/off, numbers must parse and sit in range, errors name the
variable."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal, TypeVar, cast

from gpuaccounting.clock import WallClock, build_clock
from gpuaccounting.logs import LogFormat
from gpuaccounting.names import DNS_LABEL, TOKEN_AUDIENCE

Backend = Literal["pynvml", "fake", "nodeagent"]

PREFIX = "SIDECAR_"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})

T = TypeVar("T")


class ConfigError(ValueError):
    """The environment does not describe a runnable sidecar; the message names the variable."""


def _raw(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def _required(env: Mapping[str, str], name: str) -> str:
    value = _raw(env, name)
    if value is None:
        raise ConfigError(f"{name} is required")
    return value


def _number(
    env: Mapping[str, str], name: str, default: T, convert: Callable[[str], T], *, minimum: float
) -> T:
    text = _raw(env, name)
    if text is None:
        return default
    try:
        value = convert(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not a {convert.__name__}") from None
    if not math.isfinite(cast(float, value)) or cast(float, value) < minimum:
        raise ConfigError(f"{name}={text!r} must be at least {minimum}")
    return value


def _positive_seconds(env: Mapping[str, str], name: str, default: float) -> float:
    value = _number(env, name, default, float, minimum=0.0)
    if value <= 0:
        raise ConfigError(f"{name} must be greater than 0")
    return value


def _boolean(env: Mapping[str, str], name: str, default: bool) -> bool:
    text = _raw(env, name)
    if text is None:
        return default
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ConfigError(f"{name}={text!r} is not a boolean (true/false, 1/0, yes/no, on/off)")


def _moment(env: Mapping[str, str], name: str) -> datetime | None:
    text = _raw(env, name)
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not an RFC 3339 time (e.g. 2026-03-01T00:00:00Z)") from None
    if moment.tzinfo is None:
        raise ConfigError(f"{name}={text!r} needs a timezone (Z or an offset)")
    return moment


def _cluster(env: Mapping[str, str], name: str) -> str | None:
    text = _raw(env, name)
    if text is not None and (len(text) > 63 or not re.match(DNS_LABEL, text)):
        raise ConfigError(f"{name}={text!r} is not a member cluster's name (a DNS label)")
    return text


def _choice(env: Mapping[str, str], name: str, default: str, allowed: tuple[str, ...]) -> str:
    text = _raw(env, name) or default
    if text.lower() not in allowed:
        raise ConfigError(f"{name}={text!r} must be one of {', '.join(allowed)}")
    return text.lower()


@dataclass(frozen=True, slots=True)
class Config:
    """Everything the sidecar needs to run; built once at start-up by `from_env`."""

    namespace: str
    pod_name: str
    pod_uid: str
    gpu_share: float
    timekeeper_url: str
    token_file: Path
    buffer_dir: Path
    podinfo_dir: Path | None
    # A fleet's member cluster (docs/fleet.md), named to the hub with each report; None: the hub's own.
    cluster: str | None = None
    report_interval_seconds: float = 30.0
    max_report_interval_seconds: float = 3600.0
    sample_interval_seconds: float = 1.0
    nvml_backend: Backend = "pynvml"
    nvml_library: Path | None = None
    nvml_retry_max_seconds: float = 300.0
    nodeagent_url: str | None = None
    nodeagent_token_file: Path = Path(f"/var/run/secrets/{TOKEN_AUDIENCE}/nodeagent-token")
    visible_devices: str | None = None
    fake_gpu_count: int = 1
    buffer_max_reports: int = 2880
    buffer_max_bytes: int = 8 * 1024 * 1024
    buffer_max_age_seconds: float = 24 * 3600.0
    retry_base_seconds: float = 1.0
    retry_max_seconds: float = 60.0
    request_timeout_seconds: float = 10.0
    shutdown_timeout_seconds: float = 20.0
    log_format: LogFormat = "auto"
    log_debug: bool = False
    clock_start: datetime | None = None
    clock_speed: float = 1.0
    clock_origin: float | None = None

    def clock(self) -> WallClock:
        """The clock intervals are stamped with: the system clock, or the demo's accelerated one."""
        return build_clock(self.clock_start, self.clock_speed, self.clock_origin, PREFIX)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Config:
        """Read the settings; raises ConfigError naming the first bad or missing variable."""
        env = os.environ if env is None else env
        share = _number(env, f"{PREFIX}GPU_SHARE", 0.0, float, minimum=0.0)
        if share <= 0:
            raise ConfigError(f"{PREFIX}GPU_SHARE is required and must be greater than 0")
        url = _required(env, f"{PREFIX}TIMEKEEPER_URL").rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"{PREFIX}TIMEKEEPER_URL={url!r} must start with http:// or https://")
        podinfo = _raw(env, f"{PREFIX}PODINFO_DIR")
        library = _raw(env, f"{PREFIX}NVML_LIBRARY")
        report_interval = _positive_seconds(env, f"{PREFIX}REPORT_INTERVAL_SECONDS", 30.0)
        sample_interval = _positive_seconds(env, f"{PREFIX}SAMPLE_INTERVAL_SECONDS", 1.0)
        max_interval = _positive_seconds(env, f"{PREFIX}MAX_REPORT_INTERVAL_SECONDS", 3600.0)
        if max_interval < report_interval:
            raise ConfigError(
                f"{PREFIX}MAX_REPORT_INTERVAL_SECONDS must not be below {PREFIX}REPORT_INTERVAL_SECONDS"
            )
        clock_start = _moment(env, f"{PREFIX}CLOCK_START")
        clock_speed = _positive_seconds(env, f"{PREFIX}CLOCK_SPEED", 1.0)
        clock_origin = _number(env, f"{PREFIX}CLOCK_ORIGIN", None, float, minimum=0)
        try:
            build_clock(clock_start, clock_speed, clock_origin, PREFIX)
        except ValueError as error:
            raise ConfigError(str(error)) from None
        retry_base = _positive_seconds(env, f"{PREFIX}RETRY_BASE_SECONDS", 1.0)
        retry_max = _positive_seconds(env, f"{PREFIX}RETRY_MAX_SECONDS", 60.0)
        if retry_max < retry_base:
            raise ConfigError(f"{PREFIX}RETRY_MAX_SECONDS must not be below {PREFIX}RETRY_BASE_SECONDS")
        backend = cast(
            Backend, _choice(env, f"{PREFIX}NVML_BACKEND", "pynvml", ("pynvml", "fake", "nodeagent"))
        )
        nodeagent_url = _raw(env, f"{PREFIX}NODEAGENT_URL")
        if nodeagent_url is not None and not nodeagent_url.startswith("http://"):
            raise ConfigError(f"{PREFIX}NODEAGENT_URL={nodeagent_url!r} must start with http://")
        if backend == "nodeagent" and nodeagent_url is None:
            raise ConfigError(
                f"{PREFIX}NVML_BACKEND=nodeagent needs {PREFIX}NODEAGENT_URL, e.g. http://$(HOST_IP):9402"
            )
        return cls(
            namespace=_required(env, "POD_NAMESPACE"),
            pod_name=_required(env, "POD_NAME"),
            pod_uid=_required(env, "POD_UID"),
            gpu_share=share,
            timekeeper_url=url,
            token_file=Path(_raw(env, f"{PREFIX}TOKEN_FILE") or f"/var/run/secrets/{TOKEN_AUDIENCE}/token"),
            buffer_dir=Path(_raw(env, f"{PREFIX}BUFFER_DIR") or "/var/lib/gpu-timekeeper"),
            podinfo_dir=Path(podinfo) if podinfo else None,
            cluster=_cluster(env, f"{PREFIX}CLUSTER"),
            report_interval_seconds=report_interval,
            max_report_interval_seconds=max_interval,
            sample_interval_seconds=sample_interval,
            nvml_backend=backend,
            nodeagent_url=nodeagent_url,
            nodeagent_token_file=Path(
                _raw(env, f"{PREFIX}NODEAGENT_TOKEN_FILE")
                or f"/var/run/secrets/{TOKEN_AUDIENCE}/nodeagent-token"
            ),
            nvml_library=Path(library) if library else None,
            nvml_retry_max_seconds=_positive_seconds(env, f"{PREFIX}NVML_RETRY_MAX_SECONDS", 300.0),
            visible_devices=env.get("NVIDIA_VISIBLE_DEVICES"),
            fake_gpu_count=_number(env, f"{PREFIX}FAKE_GPU_COUNT", 1, int, minimum=0),
            buffer_max_reports=_number(env, f"{PREFIX}BUFFER_MAX_REPORTS", 2880, int, minimum=2),
            buffer_max_bytes=_number(env, f"{PREFIX}BUFFER_MAX_BYTES", 8 * 1024 * 1024, int, minimum=4096),
            buffer_max_age_seconds=_positive_seconds(env, f"{PREFIX}BUFFER_MAX_AGE_SECONDS", 24 * 3600.0),
            retry_base_seconds=retry_base,
            retry_max_seconds=retry_max,
            request_timeout_seconds=_positive_seconds(env, f"{PREFIX}REQUEST_TIMEOUT_SECONDS", 10.0),
            shutdown_timeout_seconds=_positive_seconds(env, f"{PREFIX}SHUTDOWN_TIMEOUT_SECONDS", 20.0),
            log_format=cast(LogFormat, _choice(env, f"{PREFIX}LOG_FORMAT", "auto", ("auto", "json", "text"))),
            log_debug=_boolean(env, f"{PREFIX}LOG_DEBUG", False),
            clock_start=clock_start,
            clock_speed=clock_speed,
            clock_origin=clock_origin,
        )
