"""Who is calling: bearer tokens to principals (constant-time comparison of sha256 digests)."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from sqlalchemy.orm import Session

from curator_service import repository as repo
from curator_service.db import Database
from shared.servicekit.tokens import hash_token


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


def authenticate(db: Database, admin_token_hash: str, token: str) -> Principal | None:
    """The principal of a bearer token, or None, read in a short read transaction of its own."""
    if hmac.compare_digest(hash_token(token), admin_token_hash):
        return Principal("admin")
    with db.session(write=False) as session:
        return authenticate_in(session, admin_token_hash, token)


def authenticate_in(session: Session, admin_token_hash: str, token: str) -> Principal | None:
    """The principal of a bearer token, or None, read in the caller's transaction (so a revocation committed
    before it is seen, and the partner row stays in the session's identity map for the rest of it).

    Comparisons are constant-time on sha256 digests.
    """
    digest = hash_token(token)
    if hmac.compare_digest(digest, admin_token_hash):
        return Principal("admin")
    partner = repo.get_partner_by_token_hash(session, digest)
    if partner is None or not hmac.compare_digest(partner.token_hash, digest):
        return None
    if partner.revoked_at is not None:
        return None
    # The identity map holds its rows weakly: this reference keeps the partner row there for the rest of
    # the session, so ``repository.get_partner`` finds it without a statement.
    session.info["authenticated_partner"] = partner
    return Principal("partner", partner.id)
