"""Who calls a federation endpoint: the modeler (its own token) or one agent of one federation (an agent
token, stored as its sha256 digest only): a :class:`~shared.servicekit.principal.Principal` of kind
``modeler``, or ``agent`` with ``agent_id`` and ``federation_id``."""

from __future__ import annotations

import hmac

from sqlalchemy.orm import Session

from modeler_service.exceptions import Forbidden
from modeler_service.federations import repository as repo
from shared.servicekit.principal import Principal
from shared.servicekit.tokens import hash_token

__all__ = ["AGENT_TOKEN_PREFIX", "MODELER", "Principal", "authenticate", "require_modeler"]

AGENT_TOKEN_PREFIX = "pobo_a_"  # noqa: S105 - a prefix, not a secret

MODELER = Principal("modeler")


def authenticate(session: Session, modeler_token: str, token: str) -> Principal | None:
    """The principal of a bearer token, or None (constant-time comparisons of the modeler token, and of
    sha256 digests: the agent lookup is by digest)."""
    if hmac.compare_digest(token.encode("utf-8"), modeler_token.encode("utf-8")):
        return MODELER
    if not token.startswith(AGENT_TOKEN_PREFIX):
        return None
    agent = repo.agent_by_token_hash(session, hash_token(token))
    if agent is None or not hmac.compare_digest(agent.token_hash, hash_token(token)):
        return None
    return Principal("agent", agent_id=agent.id, federation_id=agent.federation_id)


def require_modeler(principal: Principal) -> None:
    if principal.kind != "modeler":
        raise Forbidden("this needs the modeler token; an agent token may only read and submit")
