"""Who is calling: bearer tokens to principals (constant-time comparison of sha256 digests).

A :class:`~shared.servicekit.principal.Principal` is ``admin`` or ``partner`` (with ``partner_id``).
"""

from __future__ import annotations

import hmac

from sqlalchemy.orm import Session

from curator_service import repository as repo
from curator_service.db import Database
from shared.servicekit.principal import Principal
from shared.servicekit.tokens import hash_token

__all__ = ["Principal", "authenticate", "authenticate_in"]


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
    found = repo.get_partner_by_token_hash(session, digest)
    if found is None:
        return None
    partner, token_row = found
    if not hmac.compare_digest(token_row.token_hash, digest):
        return None
    if partner.revoked_at is not None or token_row.revoked_at is not None:
        return None
    # The identity map holds its rows weakly: this reference keeps the partner row there for the rest of
    # the session, so ``repository.get_partner`` finds it without a statement.
    session.info["authenticated_partner"] = partner
    return Principal("partner", partner.id)
