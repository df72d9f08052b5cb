"""Partners: tokens (shown once, stored hashed), grants of releases, query quotas, revocation."""

from __future__ import annotations

import secrets
from collections.abc import Sequence

from sqlalchemy.orm import Session

from curator_service import gradient_repository as grepo
from curator_service import repository as repo
from curator_service.exceptions import Conflict, InvalidInput, NotFound
from curator_service.models import Partner, utcnow
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
    partner = Partner(
        name=name.strip() or name,
        token_hash=hash_token(token),
        max_queries=max_queries,
        output_privacy=policy,
    )
    repo.add(session, partner)
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
