"""FastAPI dependencies: the app's components, the per-request session and who is calling."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from curator_service.config import Settings
from curator_service.db import Database
from curator_service.exceptions import Forbidden, Unauthorized
from curator_service.services.auth import Principal, authenticate, authenticate_in
from curator_service.services.releases import ComputeBackend
from curator_service.storage import ArrayStore
from shared.servicekit.db import READ_METHODS, request_session

bearer_scheme = HTTPBearer(
    auto_error=False,
    description="The curator's admin token, or a partner token created with POST /v1/partners.",
)


@dataclass(frozen=True)
class Components:
    settings: Settings
    db: Database
    store: ArrayStore
    admin_token_hash: str
    compute_backend: ComputeBackend = field(default_factory=ComputeBackend)  # local, or the Dask cluster


def components_of(request: Request) -> Components:
    components: Components = request.app.state.components
    return components


async def get_components(request: Request) -> Components:
    """The app's components. (Dependencies that do no I/O are ``async``: FastAPI runs a plain ``def``
    dependency in the worker-thread pool, a hop that costs more than the dependency itself.)"""
    return components_of(request)


ComponentsDep = Annotated[Components, Depends(get_components)]


def get_session(request: Request) -> Iterator[Session]:
    """One session per request; commits when the route returns, rolls back on any error.

    ``scope="function"`` (below) makes the commit happen *before* the response is sent, so a client never
    sees a 2xx for something that did not commit. Requests that may write (POST, PUT, PATCH, DELETE) get a
    write session (SQLite: BEGIN IMMEDIATE at the first statement). If the transaction does not commit,
    the callbacks registered with ``services.datasets.on_rollback`` run (they delete files written for it).
    """
    db = components_of(request).db
    yield from request_session(db, write=request.method not in READ_METHODS)


SessionDep = Annotated[Session, Depends(get_session, scope="function")]
# A row id in a path: bounded to the 32-bit INTEGER range the databases store, so an oversized id is a 422,
# not an integer overflow inside the driver (found by the schemathesis fuzz tests).
RowId = Annotated[int, Path(ge=-(2**31), le=2**31 - 1)]


def _token(credentials: HTTPAuthorizationCredentials | None) -> str:
    """The bearer token sent; 401 when there is none."""
    if credentials is None or not credentials.credentials:
        raise Unauthorized("missing bearer token: send the header 'Authorization: Bearer <token>'")
    return credentials.credentials


def get_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> Principal:
    components = components_of(request)
    principal = authenticate(components.db, components.admin_token_hash, _token(credentials))
    if principal is None:
        raise Unauthorized("invalid or revoked token")
    request.state.principal = principal
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def get_partner_in_session(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
    session: SessionDep,
) -> Principal:
    """A partner principal authenticated inside the request's own transaction (one transaction fewer than
    :func:`get_principal`; a revocation committed before the request is seen all the same).

    The partner row stays in the session, so the route reads it again without a statement. 401 for a
    missing, invalid or revoked token and 403 for the admin token, as :func:`require_partner`.
    """
    return partner_in_session(request, credentials, session)


def partner_in_session(
    request: Request, credentials: HTTPAuthorizationCredentials | None, session: Session
) -> Principal:
    """:func:`get_partner_in_session` as a plain call, for a route that opens its session itself."""
    principal = authenticate_in(session, components_of(request).admin_token_hash, _token(credentials))
    if principal is None:
        raise Unauthorized("invalid or revoked token")
    request.state.principal = principal
    return _partner_only(principal)


async def require_admin(principal: PrincipalDep) -> Principal:
    if not principal.is_admin:
        raise Forbidden("this endpoint needs the curator's admin token; a partner token is not allowed")
    return principal


async def require_partner(principal: PrincipalDep) -> Principal:
    return _partner_only(principal)


def _partner_only(principal: Principal) -> Principal:
    if principal.is_admin:
        raise Forbidden(
            "queries are asked with a partner token (create one with POST /v1/partners); "
            "the admin token cannot ask queries"
        )
    return principal


AdminDep = Annotated[Principal, Depends(require_admin)]
PartnerDep = Annotated[Principal, Depends(require_partner)]
#: :data:`PartnerDep` authenticated in the request's session (routes that use ``SessionDep`` anyway).
PartnerInSessionDep = Annotated[Principal, Depends(get_partner_in_session)]


async def bearer_credentials(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> HTTPAuthorizationCredentials:
    """The bearer credentials as sent; 401 when there are none (checked before the body is validated, as
    an authenticating dependency would be). The token itself is checked by :func:`partner_in_session`."""
    _token(credentials)
    assert credentials is not None
    return credentials


#: The bearer credentials (a route that authenticates in a session it opens itself).
CredentialsDep = Annotated[HTTPAuthorizationCredentials, Depends(bearer_credentials)]
