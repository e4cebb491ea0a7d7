"""Static mode: bearer tokens checked against SHA-256 digests in settings, for clusters-less runs. Admin
tokens may do everything, reporter tokens report and read, reader tokens read; reporter and reader tokens
hold every namespace or only those they are scoped to. A principal's name never holds the token."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from timekeeper.auth.base import Action, Principal
from timekeeper.auth.digests import TokenDigests
from timekeeper.settings import Settings

_ROLE_ACTIONS: dict[str, frozenset[Action]] = {
    "admin": frozenset(Action),
    "reporter": frozenset({Action.REPORT, Action.READ}),
    "reader": frozenset({Action.READ}),
}


@dataclass(frozen=True, slots=True)
class _Grant:
    role: str
    namespaces: frozenset[str] | None  # None: every namespace


class StaticAccessControl:
    def __init__(
        self,
        admin: Iterable[str],
        reporter: Iterable[str],
        reader: Iterable[str],
        scoped_readers: Mapping[str, Iterable[str]] | None = None,
        scoped_reporters: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        self._grants: dict[str, _Grant] = {}
        for role, digests in (("admin", admin), ("reporter", reporter), ("reader", reader)):
            self._grants.update((digest.lower(), _Grant(role, None)) for digest in digests)
        for role, scoped in (("reader", scoped_readers), ("reporter", scoped_reporters)):
            for digest, namespaces in (scoped or {}).items():
                self._grants[digest.lower()] = _Grant(role, frozenset(namespaces))
        self._accepted = TokenDigests(self._grants)
        self._roles: dict[str, str] = {}

    async def authenticate(self, token: str, cluster: str | None = None) -> Principal | None:
        """Static tokens belong to no member cluster (settings refuse members in static mode)."""
        if cluster is not None:
            return None
        digest = self._accepted.match(token)
        if digest is None:
            return None
        grant = self._grants[digest]
        name = f"{grant.role}-token:{digest[:12]}"
        self._roles[name] = grant.role
        return Principal(name=name, namespaces=grant.namespaces)

    async def authorize(self, principal: Principal, action: Action, namespace: str | None) -> bool:
        role = self._roles.get(principal.name)
        if role is None or action not in _ROLE_ACTIONS[role]:
            return False
        return principal.namespaces is None or namespace in principal.namespaces

    async def aclose(self) -> None:
        self._roles.clear()


def build_static(settings: Settings) -> StaticAccessControl:
    return StaticAccessControl(
        settings.admin_token_sha256,
        settings.reporter_token_sha256,
        settings.reader_token_sha256,
        settings.reader_tokens,
        settings.reporter_tokens,
    )
