"""Federations (DP-FTS-DE): the modeler as coordinator, hospitals' agents submitting (``API.md``).

Who may call: the modeler token everything; an agent token (``POST .../agents``, shown once) only reads its
own federation and its rounds and submits to it. The sync routes run in FastAPI's thread pool; the round
long-poll is ``async`` and waits between short reads without holding a database session.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool

from modeler_service import federations
from modeler_service.api.deps import ComponentsDep, PrincipalDep, SessionDep
from modeler_service.federation_schemas import (
    AgentCreate,
    AgentCreated,
    FederationCreate,
    FederationPublic,
    FederationsPublic,
    RoundPublic,
    SubmissionAccepted,
    SubmissionCreate,
)
from modeler_service.models import utcnow

router = APIRouter(prefix="/v1/federations", tags=["federations"])

#: Seconds between two reads of a round while a long-poll waits for it to close.
_POLL_SECONDS = 0.1

FederationId = Annotated[str, Path(min_length=1, max_length=32, pattern=r"^[0-9a-f]+$")]
RoundNumber = Annotated[int, Path(ge=1, le=1_000_000)]

_ERRORS: dict[int | str, dict[str, str]] = {
    403: {"description": "An agent token where the modeler token is needed, or the reverse"},
    404: {"description": "No such federation (or not the agent's own)"},
}


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    summary="Create a federation (modeler token): draws and publishes the shared features",
    responses={403: _ERRORS[403]},
)
def create_federation(
    body: FederationCreate, principal: PrincipalDep, session: SessionDep
) -> FederationPublic:
    """The parameters are public and fixed: the box and its P equal-volume sub-regions (P a product of 2, 3,
    5, 7), M features of the SE kernel (``lengthscale``), the sampling probability q, noise multiplier z,
    clipping bound S, rounds, the epsilon budget (PLD accountant, at ``delta``), ``round_seconds`` and the
    temperature schedule of the softmax weights. The answer carries the published features (``rff``).

    Trust: the modeler (coordinator) sees each agent's raw submission, a posterior sample of that
    hospital's observations; it never logs or returns them and deletes them when their round closes.
    """
    federations.require_modeler(principal)
    return federations.to_public(session, federations.create_federation(session, body), principal)


@router.get("", summary="List federations (modeler token)", responses={403: _ERRORS[403]})
def list_federations(principal: PrincipalDep, session: SessionDep) -> FederationsPublic:
    federations.require_modeler(principal)
    return federations.list_federations(session)


@router.post(
    "/{federation_id}/agents",
    status_code=status.HTTP_201_CREATED,
    summary="Register an agent (modeler token); its token is shown once",
    responses={**_ERRORS, 409: {"description": "The federation has started, or the name is taken"}},
)
def register_agent(
    federation_id: FederationId, body: AgentCreate, principal: PrincipalDep, session: SessionDep
) -> AgentCreated:
    """Agents register before ``start``; the agent token is scoped to this federation (stored as sha256)."""
    return federations.register_agent(session, principal, federation_id, body)


@router.post(
    "/{federation_id}/start",
    summary="Freeze the agent list and the sub-region assignment; open round 1 (modeler token)",
    responses={
        **_ERRORS,
        409: {"description": "Already started, no agents, or one round would pass the epsilon budget"},
    },
)
def start(federation_id: FederationId, principal: PrincipalDep, session: SessionDep) -> FederationPublic:
    """N (``participants``) and each agent's position and sub-region (round robin, position mod P) are
    fixed from here on; the weights and the noise depend on them only. Registering later is a 409."""
    federation = federations.start(session, principal, federation_id)
    return federations.to_public(session, federation, principal)


@router.get(
    "/{federation_id}",
    summary="A federation: status, current round, epsilon so far (modeler or its agents)",
    responses=_ERRORS,
)
def get_federation(
    federation_id: FederationId, principal: PrincipalDep, session: SessionDep
) -> FederationPublic:
    return federations.get_federation(session, principal, federation_id)


@router.post(
    "/{federation_id}/rounds/{number}/submissions",
    status_code=status.HTTP_202_ACCEPTED,
    summary="Submit omega for the open round (agent token; Idempotency-Key)",
    responses={
        **_ERRORS,
        409: {
            "description": "Not the open round, its deadline passed, or the agent already submitted for it"
        },
        422: {"description": "omega does not have M finite values"},
    },
)
def submit(
    federation_id: FederationId,
    number: RoundNumber,
    body: SubmissionCreate,
    principal: PrincipalDep,
    session: SessionDep,
    response: Response,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> SubmissionAccepted:
    """One submission per agent per round. A retry with the same ``Idempotency-Key`` is answered 202 again
    (``Idempotent-Replayed: true``) and stores nothing. The round closes at its deadline only, never early;
    a submission then counts only if the agent is in the round's Poisson sample (unknown to anyone else).
    """
    accepted, replayed = federations.submit(
        session, principal, federation_id, number, body.omega, idempotency_key
    )
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return accepted


@router.get(
    "/{federation_id}/rounds/{number}",
    summary="A round: open, or closed with its aggregates and epsilon; `wait` long-polls until closed",
    responses=_ERRORS,
)
async def get_round(
    federation_id: FederationId,
    number: RoundNumber,
    principal: PrincipalDep,
    components: ComponentsDep,
    request: Request,
    wait: Annotated[
        float,
        Query(ge=0, le=600, description="Seconds to wait for the round to close (capped by the server)."),
    ] = 0.0,
) -> RoundPublic:
    ctx = components.ctx
    deadline = time.monotonic() + min(wait, ctx.settings.max_wait_seconds)
    while True:
        rnd = await run_in_threadpool(federations.read_round_tx, ctx.db, principal, federation_id, number)
        remaining = deadline - time.monotonic()
        if rnd.status == "closed" or remaining <= 0:
            return rnd
        if rnd.deadline <= utcnow():  # the closer has not come by yet: close it now (once, guarded)
            # a write from a GET: admitted like any writer (``servicekit.write_gate``)
            gate = request.app.state.write_gate
            await gate.run_sync(federations.close_round, ctx.db, federation_id, number)
        await asyncio.sleep(min(_POLL_SECONDS, remaining))
