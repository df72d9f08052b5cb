"""Partners: tokens (shown once, stored hashed), grants of releases, query quotas, revocation."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from curator_service import gradient_repository as grepo
from curator_service import repository as repo
from curator_service.exceptions import Conflict, InvalidInput, NotFound
from curator_service.models import LedgerEntry, Partner, PartnerToken, utcnow
from curator_service.services.outputs import OutputPolicy
from curator_service.services.releases import budget_label, fits
from shared.protocol.schemas import OutputPrivacy
from shared.servicekit.tokens import hash_token

logger = logging.getLogger(__name__)


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
    charge_confirmed: bool = True,
) -> Partner:
    """Change a partner's query quota and/or its output privacy (the partner row locked: a concurrent query
    is admitted under the old values or the new ones, never in between). A revoked partner cannot change
    (409); a quota below the queries already used is a 422.

    Output privacy may always become tighter (``tighter_problem``). It may become looser only while the
    grant keeps a per-person cap (``loosening``): within the cap a larger epsilon per answer or fresh
    repeats change nothing a person is promised; a larger cap is charged to the population's budget (the
    console asks first: ``charge_confirmed`` False refuses a charge with 409, nothing changed)."""
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
        old = OutputPolicy.from_dict(partner.output_privacy) if partner.output_privacy else None
        new = None if output_privacy is None else OutputPolicy.from_request(output_privacy)
        problem = tighter_problem(old, new)
        if problem is not None:
            loosening(session, partner_id, old, new, problem, charge_confirmed=charge_confirmed)
        partner.output_privacy = None if new is None else new.as_dict()
    session.flush()
    return partner


#: ``LedgerEntry.mechanism`` of a raised per-person output allotment.
OUTPUT_ALLOTMENT = "output-allotment"


def loosening(
    session: Session,
    partner_id: int,
    old: OutputPolicy | None,
    new: OutputPolicy | None,
    problem: str,
    *,
    charge_confirmed: bool = True,
) -> None:
    """Allow a looser output privacy within the population's budget, or refuse it (422 / 409).

    A grant's ``max_epsilon_per_row`` is its per-person allotment: whatever the epsilon per answer and
    whether repeats are fresh, no person's answers to this grant add up past it (basic composition, Dwork &
    Roth 2014, Thm. 3.16; ``docs/privacy.md``). So with a cap kept, a larger epsilon per answer or fresh
    repeats promise a person nothing more, and cost nothing. A cap raised from c to c' promises each person
    of every population the grant reaches up to c' - c more: that is charged to each such population's
    (epsilon, delta) budget as a pure-epsilon entry (delta 0), in the same relation as its releases (one
    person's record replaced: their outcome is part of it), refused with 409 when a budget has no room.
    Without a cap before or after (raw answers, or a private grant with no cap) the allotment is not
    bounded, and nothing can pay for it: 422, saying how to give the grant a cap first.
    """
    if old is None or old.max_epsilon_per_row is None or new is None or new.max_epsilon_per_row is None:
        raise InvalidInput(
            f"output_privacy of partner {partner_id} can only be tightened here: {problem}. A looser output "
            "privacy is possible only while the grant keeps a per-person cap (max_epsilon_per_row): give it "
            "one first (a PATCH with max_epsilon_per_row and its current epsilon, B and R is a tightening), "
            "then raise what it allows; a larger cap is charged to the population's budget"
        )
    extra = new.max_epsilon_per_row - old.max_epsilon_per_row
    if extra <= 0:
        logger.info("partner %d: output privacy loosened within its per-person cap (%s)", partner_id, problem)
        return
    populations = repo.granted_populations(session, partner_id)
    if populations and not charge_confirmed:
        raise Conflict(
            f"raising partner {partner_id}'s max_epsilon_per_row from {old.max_epsilon_per_row:g} to "
            f"{new.max_epsilon_per_row:g} charges epsilon {extra:g} to the budget of population(s) "
            f"{', '.join(map(str, populations))}, which cannot be undone. Tick \"Charge the population's "
            'budget" and submit again to accept it; nothing was changed'
        )
    for population_id, dataset_id in populations.items():
        population = repo.lock_population(session, population_id)
        assert population is not None
        spent, _ = repo.ledger_totals(session, population_id)
        if not fits(spent, extra, population.epsilon_budget):
            raise Conflict(
                f"privacy budget exceeded: raising partner {partner_id}'s max_epsilon_per_row from "
                f"{old.max_epsilon_per_row:g} to {new.max_epsilon_per_row:g} promises each person up to "
                f"epsilon {extra:g} more, but {budget_label(session, population)} has epsilon "
                f"{max(0.0, population.epsilon_budget - spent):g} left (budget "
                f"{population.epsilon_budget:g}, spent {spent:g}). Raise the cap by less; nothing was changed"
            )
        repo.add(
            session,
            LedgerEntry(
                population_id=population_id,
                dataset_id=dataset_id,
                mechanism=OUTPUT_ALLOTMENT,
                epsilon=extra,
                nominal_epsilon=extra,
                delta=0.0,
                native={
                    "kind": OUTPUT_ALLOTMENT,
                    "partner_id": partner_id,
                    "from": old.max_epsilon_per_row,
                    "to": new.max_epsilon_per_row,
                },
                status="spent",
            ),
        )
    logger.info(
        "partner %d: max_epsilon_per_row raised from %g to %g; charged epsilon %g to population(s) %s",
        partner_id,
        old.max_epsilon_per_row,
        new.max_epsilon_per_row,
        extra,
        ", ".join(map(str, populations)) or "none (no release granted yet)",
    )


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
