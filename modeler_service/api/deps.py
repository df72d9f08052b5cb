"""FastAPI dependencies: the app's components, the per-request session and the bearer-token check."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr
from sqlalchemy.orm import Session

from modeler_service.context import Context
from modeler_service.db import transaction
from modeler_service.exceptions import StorageError
from modeler_service.federations import access as federation_access
from modeler_service.federations.access import Principal
from modeler_service.runner import RunnerRegistry, Stepper
from shared.servicekit.db import READ_METHODS, request_session

bearer_scheme = HTTPBearer(auto_error=False, description="The modeler's API token (POBO_MODELER_TOKEN).")


@dataclass(frozen=True)
class Components:
    ctx: Context
    stepper: Stepper
    runners: RunnerRegistry
    token: SecretStr


# The light dependencies below are ``async def`` on purpose: they do no I/O, and a sync dependency would
# cost a hop to the thread pool on every request.


async def get_components(request: Request) -> Components:
    components: Components = request.app.state.components
    return components


ComponentsDep = Annotated[Components, Depends(get_components)]


async def get_context(request: Request) -> Context:
    components: Components = request.app.state.components
    return components.ctx


ContextDep = Annotated[Context, Depends(get_context)]


def get_session(request: Request) -> Iterator[Session]:
    """One session per request; commits before the response is sent, rolls back on any error; a database
    failure is answered as ``StorageError`` (503)."""
    components: Components = request.app.state.components
    write = request.method not in READ_METHODS
    yield from request_session(components.ctx.db, write=write, error=StorageError)


SessionDep = Annotated[Session, Depends(get_session, scope="function")]


async def require_token(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> None:
    """Bearer token, compared in constant time."""
    if credentials is None or not credentials.credentials:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing bearer token: send the header 'Authorization: Bearer <token>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    components: Components = request.app.state.components
    expected = components.token.get_secret_value().encode("utf-8")
    if not hmac.compare_digest(credentials.credentials.encode("utf-8"), expected):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "invalid token", headers={"WWW-Authenticate": "Bearer"}
        )


TokenDep = Depends(require_token)


def get_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> Principal:
    """The federation routes' caller: the modeler token, or an agent token (looked up by its sha256 in a
    short read transaction of its own, so that a long-poll holds no session while it waits)."""
    if credentials is None or not credentials.credentials:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing bearer token: send the header 'Authorization: Bearer <token>' (the modeler token or "
            "an agent token)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    components: Components = request.app.state.components
    with transaction(components.ctx.db, write=False) as session:
        principal = federation_access.authenticate(
            session, components.token.get_secret_value(), credentials.credentials
        )
    if principal is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "invalid token", headers={"WWW-Authenticate": "Bearer"}
        )
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]
