"""Builds the AccessControl for the configured mode. Each mode lives in its own module, imported only
when chosen, exposing `build_access_control(settings)` (sync or async)."""

from __future__ import annotations

import importlib
import inspect

from timekeeper.auth.base import AccessControl
from timekeeper.settings import Settings

MODES: dict[str, str] = {
    "static": "timekeeper.auth.static:build_static",
    "kubernetes": "timekeeper.auth.kubernetes:build_access_control",
}


async def build_access_control(settings: Settings) -> AccessControl:
    module_name, _, function_name = MODES[settings.auth_mode].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name != module_name:
            raise
        raise RuntimeError(f"auth mode {settings.auth_mode!r} is not available in this build") from error
    built = getattr(module, function_name)(settings)
    access: AccessControl = await built if inspect.isawaitable(built) else built
    return access
