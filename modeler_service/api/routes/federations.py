"""Federations (DP-FTS-DE): the modeler as coordinator, hospitals' agents submitting (``API.md``).

Who may call: the modeler token everything; an agent token (``POST .../agents``, shown once) only reads its
own federation and its rounds and submits to it. The sync routes run in FastAPI's thread pool; the round
long-poll is ``async`` and waits between short reads without holding a database session.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Header, Path, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool

from modeler_service.api.deps import ComponentsDep, PrincipalDep, SessionDep
from modeler_service.federations import access, service
from modeler_service.federations.instances import InstanceTracker
from modeler_service.models import utcnow
from shared.protocol.schemas.federations import (
    AGENT_INSTANCE_HEADER,
    AGENT_INSTANCE_PATTERN,
    AgentCreate,
    AgentCreated,
    FederationCreate,
    FederationPublic,
    FederationsPublic,
    FederationStart,
    RoundPublic,
    SubmissionAccepted,
    SubmissionCreate,
)

router = APIRouter(prefix="/v1/federations", tags=["federations"])

#: Seconds between two reads of a round while a long-poll waits for it to close.
_POLL_SECONDS = 0.1

FederationId = Annotated[str, Path(min_length=1, max_length=32, pattern=r"^[0-9a-f]+$")]
RoundNumber = Annotated[int, Path(ge=1, le=1_000_000)]


async def _instance_warning(
    request: Request,
    principal: PrincipalDep,
    instance: Annotated[
        str | None,
        Header(
            alias=AGENT_INSTANCE_HEADER,
            pattern=AGENT_INSTANCE_PATTERN,
            description="An agent process's random id (new at each start): the coordinator warns (the "
            "answer's `warning`) when two processes of one agent alternate.",
        ),
    ] = None,
) -> str | None:
    """The warning for an agent whose token two processes use at once (``federations.instances``)."""
    if principal.kind != "agent" or principal.agent_id is None or instance is None:
        return None
    tracker: InstanceTracker = request.app.state.agent_instances
    return tracker.heard(str(principal.federation_id), principal.agent_id, instance)


InstanceWarning = Annotated[str | None, Depends(_instance_warning)]

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
    access.require_modeler(principal)
    return service.to_public(session, service.create_federation(session, body), principal)


@router.get("", summary="List federations (modeler token)", responses={403: _ERRORS[403]})
def list_federations(principal: PrincipalDep, session: SessionDep) -> FederationsPublic:
    access.require_modeler(principal)
    return service.list_federations(session)


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
    return service.register_agent(session, principal, federation_id, body)


@router.post(
    "/{federation_id}/start",
    summary="Freeze the agent list and the sub-region assignment; open round 1 (modeler token)",
    responses={
        **_ERRORS,
        409: {"description": "Already started, no agents, or one round would pass the epsilon budget"},
        422: {"description": "first_round_at has no timezone, is in the past, or is more than 24 h ahead"},
    },
)
def start(
    federation_id: FederationId,
    principal: PrincipalDep,
    session: SessionDep,
    body: Annotated[FederationStart | None, Body()] = None,
) -> FederationPublic:
    """N (``participants``) and each agent's position and sub-region (round robin, position mod P) are
    fixed from here on; the weights and the noise depend on them only. Registering later is a 409.

    Round 1 accepts submissions at once. Without a body its deadline is ``round_seconds`` from now; with
    ``{"first_round_at": "<ISO 8601 time with a timezone>"}`` it is ``first_round_at + round_seconds``, so
    that agents started together with the federation (``pobo agent run`` takes a few seconds to start) all
    take part in round 1: pick the time by which every agent will be up. ``round_deadline`` in the answer
    says when round 1 closes.
    """
    first_round_at = body.first_round_at if body is not None else None
    federation = service.start(session, principal, federation_id, first_round_at)
    return service.to_public(session, federation, principal)


@router.get(
    "/{federation_id}",
    summary="A federation: status, current round, epsilon so far (modeler or its agents)",
    responses=_ERRORS,
)
def get_federation(
    federation_id: FederationId, principal: PrincipalDep, session: SessionDep, warning: InstanceWarning
) -> FederationPublic:
    public = service.get_federation(session, principal, federation_id)
    return public.model_copy(update={"warning": warning}) if warning else public


@router.post(
    "/{federation_id}/rounds/{number}/submissions",
    status_code=status.HTTP_202_ACCEPTED,
    summary="Submit omega for the open round (agent token; Idempotency-Key); the answer is its receipt",
    responses={
        **_ERRORS,
        409: {
            "description": (
                "Not the open round and no receipt of this agent in it, its deadline passed, the agent "
                "already submitted for it (under another key), or the key was used with another omega or "
                "for another round"
            )
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
    warning: InstanceWarning,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> SubmissionAccepted:
    """One submission per agent per round, accepted before the round's deadline. It leaves a receipt
    (round, agent, key, accepted time; never the omega) that outlives the round's close, when the omega
    itself is deleted: a retry with the same ``Idempotency-Key`` and the same omega is answered 202 again
    from it (``Idempotent-Replayed: true``, ``round_status`` says whether the round has closed since),
    even after the close, and stores nothing. The same key with another omega, or for another round, is a
    409; so is a closed round without a receipt of this agent. The round closes at its deadline only,
    never early; an accepted submission then counts if the agent is in the round's Poisson sample
    (unknown to anyone else, the agent included).
    """
    accepted, replayed = service.submit(
        session, principal, federation_id, number, body.omega, idempotency_key
    )
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return accepted.model_copy(update={"warning": warning}) if warning else accepted


@router.get(
    "/{federation_id}/rounds/{number}",
    summary="A round: open, or closed with its aggregates and epsilon; `wait` long-polls until closed",
    responses=_ERRORS,
    description=(
        "An agent also gets `you`, its own standing in the round from its receipt (`accepted`, "
        "`accepted_at`; nothing about other agents): once the round is closed, `accepted` says whether "
        "the round counted this agent's submission. An agent that restarts, or lost an answer to an "
        "outage, reads it to resume at the right round without submitting twice."
    ),
)
async def get_round(
    federation_id: FederationId,
    number: RoundNumber,
    principal: PrincipalDep,
    components: ComponentsDep,
    request: Request,
    warning: InstanceWarning,
    wait: Annotated[
        float,
        Query(ge=0, le=600, description="Seconds to wait for the round to close (capped by the server)."),
    ] = 0.0,
) -> RoundPublic:
    ctx = components.ctx
    deadline = time.monotonic() + min(wait, ctx.settings.max_wait_seconds)
    while True:
        rnd = await run_in_threadpool(service.read_round_tx, ctx.db, principal, federation_id, number)
        remaining = deadline - time.monotonic()
        if rnd.status == "closed" or remaining <= 0:
            return rnd.model_copy(update={"warning": warning}) if warning else rnd
        if rnd.deadline <= utcnow():  # the closer has not come by yet: close it now (once, guarded)
            # a write from a GET: admitted like any writer (``servicekit.write_gate``)
            gate = request.app.state.write_gate
            await gate.run_sync(service.close_round, ctx.db, federation_id, number)
        await asyncio.sleep(min(_POLL_SECONDS, remaining))
