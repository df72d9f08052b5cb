"""Partners: scoped bearer tokens with grants and a query quota."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from curator_service.api.deps import AdminDep, PartnerDep, RowId, SessionDep
from curator_service.models import PartnerToken
from curator_service.schemas import partner_public
from curator_service.services import partners as partner_service
from curator_service.services.outputs import public_of
from shared.protocol.schemas import (
    GrantCreate,
    PartnerCreate,
    PartnerCreated,
    PartnerPublic,
    PartnersPublic,
    PartnerUpdate,
    TokenCreated,
    TokenPublic,
    TokensPublic,
)

router = APIRouter(tags=["partners"])
_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "Missing or invalid token."},
    403: {"description": "Not the admin token."},
}


@router.post(
    "/v1/partners",
    status_code=201,
    response_model=PartnerCreated,
    summary="Create a partner token (shown only in this response)",
    description="With `output_privacy` ({epsilon, B, R}, optional `fresh_repeats`, `max_epsilon_per_row`, "
    "`store_raw`) every outcome answered to this partner is CTL(epsilon): clipped to [-(B+R), B+R], plus "
    "Laplace noise of scale 2(B+R)/epsilon (OpenDP's sampler). Each answer is charged to its person's "
    "population-wide output ledger; repeats of a row return its cached noisy answer unless `fresh_repeats`.",
    responses={
        **_ERRORS,
        409: {"description": "A gradient oracle is already granted to another partner (one each)."},
        422: {"description": "Unknown release ids or bad fields."},
    },
)
def create_partner(body: PartnerCreate, _admin: AdminDep, session: SessionDep) -> PartnerCreated:
    partner, token = partner_service.create_partner(
        session,
        name=body.name,
        release_ids=body.release_ids,
        max_queries=body.max_queries,
        output_privacy=body.output_privacy,
        gradient_oracle_ids=body.gradient_oracle_ids,
    )
    return PartnerCreated(
        id=partner.id,
        name=partner.name,
        token=token,
        release_ids=sorted(set(body.release_ids)),
        max_queries=partner.max_queries,
        output_privacy=public_of(partner),
        gradient_oracle_ids=sorted(set(body.gradient_oracle_ids)),
    )


@router.get("/v1/partners", response_model=PartnersPublic, summary="List partners", responses=_ERRORS)
def list_partners(_admin: AdminDep, session: SessionDep) -> PartnersPublic:
    partners, grants, oracle_grants = partner_service.list_partners(session)
    data = [partner_public(p, (grants.get(p.id, []), oracle_grants.get(p.id, []))) for p in partners]
    return PartnersPublic(data=data, count=len(data))


@router.get(
    "/v1/partners/me",
    response_model=PartnerPublic,
    summary="The calling partner: grants and quota used",
    responses={401: {"description": "Missing or invalid token."}, 403: {"description": "The admin token."}},
)
def me(partner: PartnerDep, session: SessionDep) -> PartnerPublic:
    assert partner.partner_id is not None
    p = partner_service.get_partner(session, partner.partner_id)
    return partner_public(p, partner_service.granted(session, p.id))


@router.get(
    "/v1/partners/{partner_id}",
    response_model=PartnerPublic,
    summary="One partner",
    responses={**_ERRORS, 404: {"description": "No such partner."}},
)
def get_partner(partner_id: RowId, _admin: AdminDep, session: SessionDep) -> PartnerPublic:
    p = partner_service.get_partner(session, partner_id)
    return partner_public(p, partner_service.granted(session, p.id))


@router.post(
    "/v1/partners/{partner_id}/grants",
    response_model=PartnerPublic,
    summary="Grant a partner more releases or gradient oracles",
    responses={
        **_ERRORS,
        404: {"description": "No such partner."},
        409: {"description": "A gradient oracle is already granted to another partner (one each)."},
        422: {"description": "Unknown release or gradient oracle ids."},
    },
)
def add_grants(partner_id: RowId, body: GrantCreate, _admin: AdminDep, session: SessionDep) -> PartnerPublic:
    p = partner_service.grant(session, partner_id, body.release_ids, body.gradient_oracle_ids)
    return partner_public(p, partner_service.granted(session, p.id))


@router.patch(
    "/v1/partners/{partner_id}",
    response_model=PartnerPublic,
    summary="Change a partner: its query quota, its output privacy",
    responses={
        **_ERRORS,
        404: {"description": "No such partner."},
        409: {"description": "The partner is revoked, or a raised per-person cap does not fit a budget."},
        422: {
            "description": "Nothing to change, a quota below the queries used, or a looser output privacy "
            "without a per-person cap before and after."
        },
    },
)
def update_partner(
    partner_id: RowId, body: PartnerUpdate, _admin: AdminDep, session: SessionDep
) -> PartnerPublic:
    """Raise (or lower, to no less than what it used) a partner's ``max_queries``: a study that stopped on
    a used-up quota continues with ``POST /v1/studies/{id}/run`` at the modeler.

    ``output_privacy`` may always become tighter (from raw answers to CTL; no larger charge per answer, no
    fresh repeats where they were cached, a per-row cap added or lowered). It may become looser only while
    the grant has a per-person cap (``max_epsilon_per_row``) before and after: within the cap a larger
    epsilon per answer or fresh repeats cost nothing (the cap is what each person is promised); a larger
    cap is charged, as ``epsilon`` = the rise and ``delta`` = 0, to the budget of every population whose
    release the partner holds (ledger entries of mechanism ``output-allotment``), or refused with 409 and
    nothing changed when one has no room. Answers already given keep their charges."""
    changes: dict[str, Any] = {"max_queries": body.max_queries}
    if "output_privacy" in body.model_fields_set:
        changes["output_privacy"] = body.output_privacy
    p = partner_service.update(session, partner_id, **changes)
    return partner_public(p, partner_service.granted(session, p.id))


@router.post(
    "/v1/partners/{partner_id}/tokens",
    status_code=201,
    response_model=TokenCreated,
    summary="A new token for a partner (rotation: the old one stays valid until revoked)",
    responses={**_ERRORS, 404: {"description": "No such partner."}, 409: {"description": "Revoked."}},
)
def add_token(partner_id: RowId, _admin: AdminDep, session: SessionDep) -> TokenCreated:
    """Shown once: the curator keeps only the token's hash. Hand it to the partner; once every study uses
    it (``PATCH /v1/studies/{id}`` with ``curator_token`` at the modeler), revoke the old token."""
    row, token = partner_service.add_token(session, partner_id)
    return TokenCreated(id=row.id, partner_id=partner_id, token=token, created_at=row.created_at)


@router.get(
    "/v1/partners/{partner_id}/tokens",
    response_model=TokensPublic,
    summary="A partner's tokens (ids and dates; never the tokens)",
    responses={**_ERRORS, 404: {"description": "No such partner."}},
)
def list_tokens(partner_id: RowId, _admin: AdminDep, session: SessionDep) -> TokensPublic:
    rows = partner_service.list_tokens(session, partner_id)
    return TokensPublic(data=[_token_public(t) for t in rows], count=len(rows))


@router.delete(
    "/v1/partners/{partner_id}/tokens/{token_id}",
    response_model=TokenPublic,
    summary="Revoke one of a partner's tokens (it answers 401 from now on)",
    responses={**_ERRORS, 404: {"description": "No such partner or token."}},
)
def revoke_token(partner_id: RowId, token_id: RowId, _admin: AdminDep, session: SessionDep) -> TokenPublic:
    return _token_public(partner_service.revoke_token(session, partner_id, token_id))


def _token_public(row: PartnerToken) -> TokenPublic:
    return TokenPublic(
        id=row.id, partner_id=row.partner_id, created_at=row.created_at, revoked=row.revoked_at is not None
    )


@router.delete(
    "/v1/partners/{partner_id}",
    response_model=PartnerPublic,
    summary="Revoke a partner's token (it answers 401 from now on; its history is kept)",
    responses={**_ERRORS, 404: {"description": "No such partner."}},
)
def revoke(partner_id: RowId, _admin: AdminDep, session: SessionDep) -> PartnerPublic:
    p = partner_service.revoke(session, partner_id)
    return partner_public(p, partner_service.granted(session, p.id))
