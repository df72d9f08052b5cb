"""Who is calling: bearer tokens to principals (constant-time comparison of sha256 digests)."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

from curator_service import repository as repo
from curator_service.db import Database


@dataclass(frozen=True)
class Principal:
    """Who is calling: the curator's admin, or a partner (by id)."""

    kind: str  # "admin" | "partner"
    partner_id: int | None = None

    @property
    def is_admin(self) -> bool:
        return self.kind == "admin"

    @property
    def actor(self) -> str:
        return "admin" if self.is_admin else f"partner:{self.partner_id}"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def authenticate(db: Database, admin_token_hash: str, token: str) -> Principal | None:
    """The principal of a bearer token, or None. Comparisons are constant-time on sha256 digests."""
    digest = hash_token(token)
    if hmac.compare_digest(digest, admin_token_hash):
        return Principal("admin")
    with db.session(write=False) as session:
        partner = repo.get_partner_by_token_hash(session, digest)
        if partner is None or not hmac.compare_digest(partner.token_hash, digest):
            return None
        if partner.revoked_at is not None:
            return None
        return Principal("partner", partner.id)
