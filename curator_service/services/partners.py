"""Partners: tokens (shown once, stored hashed), grants of releases, query quotas, revocation."""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from curator_service import gradient_repository as grepo
from curator_service import repository as repo
from curator_service.exceptions import Conflict, InvalidInput, NotFound
from curator_service.models import Partner, PartnerToken, utcnow
from curator_service.services.outputs import OutputPolicy
from shared.protocol.schemas import OutputPrivacy
from shared.servicekit.tokens import hash_token


def new_token() -> str:
    """A partner bearer token: 32 random bytes (256 bits), URL-safe, with a recognisable prefix."""
    return "pobo_p_" + secrets.token_urlsafe(32)


def _check_release_ids(session: Session, release_ids: Sequence[int]) -> None:
    missing = sorted(set(release_ids) - repo.existing_release_ids(session, release_ids))
    if missing:
        raise InvalidInput(f"unknown release id(s): {', '.join(map(str, missing))}")


def _check_oracle_ids(session: Session, oracle_ids: Sequence[int], partner_id: int | None = None) -> None:
    """Known oracles, each granted to no other partner: an oracle's design, step counter and answers are
    shared by whoever steps it, so a second grantee would read the first one's queries in them (its step
    numbers, ``steps_left``, its design's size in an error, the GP weights of every answer)."""
    missing = sorted(set(oracle_ids) - grepo.existing_oracle_ids(session, oracle_ids))
    if missing:
        raise InvalidInput(f"unknown gradient oracle id(s): {', '.join(map(str, missing))}")
    for oracle_id in dict.fromkeys(oracle_ids):
        holders = set(grepo.oracle_holders(session, oracle_id)) - ({partner_id} if partner_id else set())
        if holders:
            raise Conflict(
                f"gradient oracle {oracle_id} is already granted to partner {min(holders)}: an oracle serves "
                "one partner (its steps, design and answers would show one partner the other's queries). "
                "Create another oracle for this partner (it is charged again). Nothing was granted."
            )


def create_partner(
    session: Session,
    *,
    name: str,
    release_ids: Sequence[int],
    max_queries: int,
    output_privacy: OutputPrivacy | None = None,
    gradient_oracle_ids: Sequence[int] = (),
) -> tuple[Partner, str]:
    """A new partner token; with ``output_privacy`` every outcome answered to it is CTL-privatised."""
    _check_release_ids(session, release_ids)
    _check_oracle_ids(session, gradient_oracle_ids)
    policy = None if output_privacy is None else OutputPolicy.from_request(output_privacy).as_dict()
    token = new_token()
    partner = Partner(name=name.strip() or name, max_queries=max_queries, output_privacy=policy)
    repo.add(session, partner)
    repo.add(session, PartnerToken(partner_id=partner.id, token_hash=hash_token(token)))
    repo.add_grants(session, partner.id, release_ids)
    grepo.add_oracle_grants(session, partner.id, gradient_oracle_ids)
    return partner, token


def get_partner(session: Session, partner_id: int) -> Partner:
    partner = repo.get_partner(session, partner_id)
    if partner is None:
        raise NotFound(f"partner {partner_id} does not exist")
    return partner


def grant(
    session: Session, partner_id: int, release_ids: Sequence[int], gradient_oracle_ids: Sequence[int] = ()
) -> Partner:
    partner = get_partner(session, partner_id)
    _check_release_ids(session, release_ids)
    _check_oracle_ids(session, gradient_oracle_ids, partner_id)
    repo.add_grants(session, partner_id, release_ids)
    grepo.add_oracle_grants(session, partner_id, gradient_oracle_ids)
    return partner


#: ``update``'s "leave the output privacy as it is".
KEEP: Any = object()


def update(
    session: Session,
    partner_id: int,
    *,
    max_queries: int | None = None,
    output_privacy: OutputPrivacy | None | Any = KEEP,
) -> Partner:
    """Change a partner's query quota and/or tighten its output privacy (the partner row locked: a
    concurrent query is admitted under the old values or the new ones, never in between). A revoked
    partner cannot change (409); a quota below the queries already used, or a looser output privacy, is a
    422 (``tighter_problem``)."""
    partner = session.get(Partner, partner_id, with_for_update=True)
    if partner is None:
        raise NotFound(f"partner {partner_id} does not exist")
    if partner.revoked_at is not None:
        raise Conflict(f"partner {partner_id} is revoked; create a new partner instead")
    if max_queries is not None:
        if max_queries < partner.queries_used:
            raise InvalidInput(
                f"max_queries must be at least the {partner.queries_used} queries partner {partner_id} has "
                f"used, got {max_queries}"
            )
        partner.max_queries = max_queries
    if output_privacy is not KEEP:
        new = None if output_privacy is None else OutputPolicy.from_request(output_privacy)
        problem = tighter_problem(
            OutputPolicy.from_dict(partner.output_privacy) if partner.output_privacy else None, new
        )
        if problem is not None:
            raise InvalidInput(f"output_privacy of partner {partner_id} can only be tightened: {problem}")
        partner.output_privacy = None if new is None else new.as_dict()
    session.flush()
    return partner


def tighter_problem(old: OutputPolicy | None, new: OutputPolicy | None) -> str | None:
    """Why ``new`` is looser than ``old`` for the answers still to come, or None when it is as tight or
    tighter: raw answers may become private; a private grant keeps a charge per answer no larger, no fresh
    repeats where repeats were cached, and a per-row cap no larger (none where there was one: looser)."""
    if old is None:
        return None
    if new is None:
        return "raw answers would replace its CTL answers; create a partner without output privacy instead"
    if new.charged_epsilon > old.charged_epsilon * (1 + 1e-12):
        return (
            f"an answer would cost {new.charged_epsilon:.6g} instead of {old.charged_epsilon:.6g} "
            "(ask for a smaller epsilon, or a larger B + R)"
        )
    if new.fresh_repeats and not old.fresh_repeats:
        return "fresh_repeats would give fresh noise (and charges) where repeats were answered from the cache"
    if old.max_epsilon_per_row is not None and (
        new.max_epsilon_per_row is None or new.max_epsilon_per_row > old.max_epsilon_per_row
    ):
        return f"max_epsilon_per_row would rise above {old.max_epsilon_per_row:g}"
    return None


def add_token(session: Session, partner_id: int) -> tuple[PartnerToken, str]:
    """A new bearer token of the partner (its other tokens stay valid until revoked): a rotation hands the
    new one over, moves every client to it (``PATCH /v1/studies/{id}`` at the modeler), then revokes the old
    one. A revoked partner gets none (409)."""
    partner = get_partner(session, partner_id)
    if partner.revoked_at is not None:
        raise Conflict(f"partner {partner_id} is revoked; create a new partner instead")
    token = new_token()
    row = PartnerToken(partner_id=partner_id, token_hash=hash_token(token))
    repo.add(session, row)
    return row, token


def list_tokens(session: Session, partner_id: int) -> list[PartnerToken]:
    get_partner(session, partner_id)
    return repo.partner_tokens(session, partner_id)


def revoke_token(session: Session, partner_id: int, token_id: int) -> PartnerToken:
    """Revoke one of the partner's tokens (it answers 401 from now on); idempotent."""
    row = next((t for t in list_tokens(session, partner_id) if t.id == token_id), None)
    if row is None:
        raise NotFound(f"partner {partner_id} has no token {token_id}")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        session.flush()
    return row


def revoke(session: Session, partner_id: int) -> Partner:
    partner = get_partner(session, partner_id)
    if partner.revoked_at is None:
        partner.revoked_at = utcnow()
        session.flush()
    return partner


def granted(session: Session, partner_id: int) -> tuple[list[int], list[int]]:
    """(release ids, gradient oracle ids) the partner was granted."""
    return repo.granted_release_ids(session, partner_id), grepo.granted_oracle_ids(session, partner_id)


def list_partners(
    session: Session,
) -> tuple[Sequence[Partner], dict[int, list[int]], dict[int, list[int]]]:
    return (
        repo.list_partners(session),
        repo.grants_by_partner(session),
        grepo.oracle_grants_by_partner(session),
    )
