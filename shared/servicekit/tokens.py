"""Bearer tokens at rest: only their sha256 digest is stored, and tokens are compared digest to digest in
constant time (``hmac.compare_digest``), so a stored value never lets anyone call the API."""

from __future__ import annotations

import hashlib

__all__ = ["hash_token"]


def hash_token(token: str) -> str:
    """The hex sha256 digest of a bearer token (what a database keeps instead of the token)."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()
