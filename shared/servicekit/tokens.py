"""Bearer tokens at rest: only their sha256 digest is stored, and tokens are compared digest to digest in
constant time (``hmac.compare_digest``), so a stored value never lets anyone call the API."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable

__all__ = ["hash_token", "is_token"]


def hash_token(token: str) -> str:
    """The hex sha256 digest of a bearer token (what a database keeps instead of the token)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def is_token(secret: str) -> Callable[[str], bool]:
    """A constant-time test "is this the operator token?" (sha256 digests compared, so the length of a
    wrong token tells nothing; the secret itself is not kept)."""
    expected = hash_token(secret)

    def check(token: str) -> bool:
        return hmac.compare_digest(hash_token(token), expected)

    return check
