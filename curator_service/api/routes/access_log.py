"""The access log: who called what, when, with which status (never bodies)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from curator_service.api.deps import AdminDep, SessionDep
from curator_service.schemas import access_entry
from curator_service.services import access_log as access_service
from shared.protocol.schemas import AccessLogPublic

router = APIRouter(tags=["access log"])


@router.get(
    "/v1/access-log",
    response_model=AccessLogPublic,
    summary="Authenticated (and rejected) /v1 requests and console actions, oldest first (admin)",
    description="Every /v1 request, and every action of the browser console (a POST: an upload, a "
    "release, a partner created, changed or revoked, a token created or revoked, a grant, a measurement, a "
    "gradient oracle, a sign-in) with the operator's console session as its actor. Never a body. With the "
    "setting `access_log_retention_days`, entries older than that are moved to the archive files "
    "(`<data dir>/archive/access-log-<first id>-<last id>.jsonl.gz`, see docs/operations.md, Retention): "
    "this lists what remains in the database.",
    responses={401: {"description": "Missing or invalid token."}, 403: {"description": "Not the admin."}},
)
def access_log(
    _admin: AdminDep,
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    partner_id: Annotated[
        int | None, Query(ge=-(2**31), le=2**31 - 1, description="Only this partner's requests.")
    ] = None,
    after_id: Annotated[
        int | None, Query(ge=-(2**31), le=2**31 - 1, description="Only entries with a larger id (paging).")
    ] = None,
) -> AccessLogPublic:
    entries = access_service.access_log(session, limit=limit, partner_id=partner_id, after_id=after_id)
    return AccessLogPublic(entries=[access_entry(e) for e in entries], count=len(entries))
