"""Static mode: bearer tokens checked against SHA-256 digests kept in settings, for clusters-less runs.

Roles: admin tokens may do everything; reporter tokens may report for any pod and read; reader tokens
may read. The principal's name (what the audit log records) names the role and the digest's first
characters, never the token.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from timekeeper.auth.base import Action, Principal
from timekeeper.settings import Settings

_ROLE_ACTIONS: dict[str, frozenset[Action]] = {
    "admin": frozenset(Action),
    "reporter": frozenset({Action.REPORT, Action.READ}),
    "reader": frozenset({Action.READ}),
}


class StaticAccessControl:
    def __init__(self, admin: Iterable[str], reporter: Iterable[str], reader: Iterable[str]) -> None:
        self._digests: list[tuple[bytes, str]] = [
            (digest.lower().encode(), role)
            for role, digests in (("admin", admin), ("reporter", reporter), ("reader", reader))
            for digest in digests
        ]
        self._roles: dict[str, str] = {}

    async def authenticate(self, token: str) -> Principal | None:
        presented = hashlib.sha256(token.encode()).hexdigest().encode()
        matched: str | None = None
        # Compare against every digest without stopping early, so timing says nothing about which matched.
        for digest, role in self._digests:
            if hmac.compare_digest(presented, digest) and matched is None:
                matched = role
        if matched is None:
            return None
        name = f"{matched}-token:{presented[:12].decode()}"
        self._roles[name] = matched
        return Principal(name=name)

    async def authorize(self, principal: Principal, action: Action, namespace: str | None) -> bool:
        role = self._roles.get(principal.name)
        return role is not None and action in _ROLE_ACTIONS[role]

    async def aclose(self) -> None:
        self._roles.clear()


def build_static(settings: Settings) -> StaticAccessControl:
    return StaticAccessControl(
        settings.admin_token_sha256, settings.reporter_token_sha256, settings.reader_token_sha256
    )
