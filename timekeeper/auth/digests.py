"""Bearer tokens known by their SHA-256 digests (static mode's roles, the metrics tokens): the settings
hold digests only, never a token."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable


class TokenDigests:
    """Accepted tokens by SHA-256 digest. Every digest is compared, without stopping early, so timing
    says nothing about which one matched."""

    def __init__(self, digests: Iterable[str]) -> None:
        self._digests = [digest.lower().encode() for digest in digests]

    def match(self, token: str) -> str | None:
        """The hex digest of the token when it is one of these, else None."""
        presented = hashlib.sha256(token.encode()).hexdigest().encode()
        found = False
        for digest in self._digests:
            found = hmac.compare_digest(presented, digest) or found
        return presented.decode() if found else None
