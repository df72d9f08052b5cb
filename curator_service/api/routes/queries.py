"""Queries: "what is the outcome of row i?" (partners), results (admin), long-polling, reconciliation."""

from __future__ import annotations

import asyncio
import time
from functools import partial
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Header, Request, Response
from fastapi import Query as QueryParam
from fastapi.concurrency import run_in_threadpool

from curator_service.api.deps import (
    AdminDep,
    ComponentsDep,
    CredentialsDep,
    PrincipalDep,
    RowId,
    SessionDep,
    components_of,
    partner_in_session,
)
from curator_service.api.lanes import TRIED_IN_CORE, answer_core
from curator_service.models import Query
from curator_service.schemas import query_public
from curator_service.services import queries as query_service
from curator_service.services.queries import QueryView
from shared.protocol.schemas import QueriesPublic, QueryCreate, QueryLogVerification, QueryPublic, QueryResult
from shared.servicekit.db import transaction
from shared.servicekit.write_gate import WriteGate

router = APIRouter(tags=["queries"])

_POLL_SECONDS = 0.2
_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "Missing or invalid token."},
    403: {"description": "Not granted / not yours / wrong kind of token."},
    404: {"description": "No such release or query."},
    410: {
        "description": "Its dataset was erased (`DELETE /v1/datasets/{id}`); the detail says what: "
        "`release N was erased: its dataset was erased by the curator`, `dataset N was erased`, ..."
    },
}


@router.post(
    "/v1/releases/{release_id}/queries",
    status_code=201,
    response_model=QueryPublic,
    summary="Ask for the outcome of row `index` (partner)",
    description="Every answer is on disk, with its charges and its link in the release's query chain, "
    "before it is sent. `column` datasets answer at once (stored outcome + fresh Gaussian noise of "
    "`noise_std`), question and answer committed together; `manual` ones are committed `pending` and answer "
    "until the curator posts the result (poll `GET /v1/queries/{id}?wait=30`). With an `Idempotency-Key`, "
    "a retry (even a concurrent one) returns the same query and is never charged again; the response then "
    "carries `Idempotent-Replayed: true`. For a partner granted with `output_privacy` the answer is CTL: "
    "clipped to [-(B+R), B+R] plus Laplace noise of scale 2(B+R)/epsilon, charged to the person's output "
    "ledger (`charged_epsilon`); a repeated row returns the partner's own earlier noisy answer (free) "
    "unless the grant has `fresh_repeats`. What a partner is told never depends on another partner's "
    "queries: caches and output allotments are per grant.",
    responses={
        **_ERRORS,
        409: {
            "description": "The Idempotency-Key was used for a different release or index, or (output "
            "privacy) this grant's answers about the person would pass its max_epsilon_per_row: nothing "
            "charged."
        },
        422: {"description": "Index out of range."},
        429: {"description": "The partner's query quota is used up."},
    },
)
async def create_query(
    release_id: RowId,
    body: QueryCreate,
    credentials: CredentialsDep,
    request: Request,
    idempotency_key: Annotated[
        str | None,
        Header(
            max_length=200, description="Any unique string per logical query, e.g. '<study>-<iteration>'."
        ),
    ] = None,
) -> Response:
    # The hot path of every iteration is the fast lane (``api.lanes``), which answers the common case in
    # Core before this route is reached. A request it does not take comes here: in one hop to the
    # worker-thread pool and one write transaction, Core first (unless the lane tried it already), then
    # the ORM path, which answers, replays or refuses everything else.
    components = components_of(request)

    def ask() -> tuple[bytes, bool]:
        state = request.scope.setdefault("state", {})  # request.state's dict (the access log's entry)
        if not state.get(TRIED_IN_CORE):
            content = answer_core(
                components, state, credentials.credentials, release_id, body.index, idempotency_key
            )
            if content is not None:
                return content, False
        with transaction(components.db) as session:
            partner = partner_in_session(request, credentials, session)
            query, replayed = query_service.create_query(
                session,
                components.store,
                partner,
                release_id,
                body.index,
                idempotency_key,
                state.get("access_log"),  # written with the answer (one commit)
            )
            if replayed and isinstance(query, Query):  # a replay shows the supersessions since
                view = query_service.view_of(session, partner, query)
                return _json(query_public(query, corrections=view.corrections)), replayed
            return _json(query_public(query)), replayed

    # Serialised in the worker thread into the JSON FastAPI would send for the ``QueryPublic`` (it would
    # otherwise validate the model it was given again, then serialise it the same way).
    content, replayed = await anyio.to_thread.run_sync(ask)
    headers = {"Idempotent-Replayed": "true"} if replayed else None
    return Response(content, status_code=201, headers=headers, media_type="application/json")


def _json(query: QueryPublic) -> bytes:
    return query.model_dump_json(by_alias=True).encode("utf-8")


@router.get(
    "/v1/releases/{release_id}/queries",
    response_model=QueriesPublic,
    summary="Queries of a release in creation order (admin: all; partner: its own)",
    description="A partner's complete queries count as delivered to it from this answer on (see "
    "`POST /v1/queries/{id}/corrections`).",
    responses=_ERRORS,
)
async def list_queries(release_id: RowId, principal: PrincipalDep, request: Request) -> QueriesPublic:
    db = components_of(request).db
    found = await run_in_threadpool(query_service.query_list, db, principal, release_id)
    if found.undelivered:  # record the delivery, admitted as a writer (``write_gate``)
        gate: WriteGate = request.app.state.write_gate
        found = await gate.run_sync(
            partial(query_service.query_list, db, principal, release_id, deliver=True)
        )
    view = [_public(v, principal.is_admin) for v in found.views]
    return QueriesPublic(queries=view, count=len(view))


def _public(view: QueryView, admin: bool) -> QueryPublic:
    return query_public(view.query, admin=admin, corrections=view.corrections)


@router.get(
    "/v1/releases/{release_id}/queries/verify",
    response_model=QueryLogVerification,
    summary="Verify the release's query-log hash chain (admin, or the granted partner)",
    description="Each query joins its release's chain when its outcome is recorded: "
    "`hash = sha256(prev_hash + canonical JSON of the query)`, with the release keeping the head (count and "
    "last hash). Any edited, deleted, reordered or truncated entry makes `ok` false and names the first "
    "bad position. Compare with the modeler's `GET /v1/studies/{id}/audit/verify`, or run "
    "`pobo reconcile`.",
    responses=_ERRORS,
)
def verify_queries(release_id: RowId, principal: PrincipalDep, session: SessionDep) -> QueryLogVerification:
    result, head = query_service.verify_queries(session, principal, release_id)
    return QueryLogVerification(
        ok=result.ok, entries=result.entries, first_bad_seq=result.first_bad_seq, head=head
    )


@router.get(
    "/v1/queries/{query_id}",
    response_model=QueryPublic,
    summary="One query; `wait` long-polls until it is complete",
    description="The first answer that sends a partner its query complete records the delivery "
    "(`delivered_at`): from then on a changed value is a supersession, listed in `corrections`.",
    responses=_ERRORS,
)
async def get_query(
    query_id: RowId,
    principal: PrincipalDep,
    components: ComponentsDep,
    request: Request,
    wait: Annotated[
        float, QueryParam(ge=0, le=300, description="Seconds to wait for completion (capped by the server).")
    ] = 0.0,
) -> QueryPublic:
    deadline = time.monotonic() + min(wait, components.settings.max_wait_seconds)
    while True:
        view = await run_in_threadpool(
            query_service.read_query, components.db, components.store, principal, query_id
        )
        remaining = deadline - time.monotonic()
        if view.query.status == "complete" or remaining <= 0:
            if query_service.needs_delivery(principal, view.query):
                gate: WriteGate = request.app.state.write_gate
                view = await gate.run_sync(query_service.deliver, components.db, principal, query_id)
            return _public(view, principal.is_admin)
        await asyncio.sleep(min(_POLL_SECONDS, remaining))


@router.post(
    "/v1/queries/{query_id}/result",
    response_model=QueryPublic,
    summary="Post the measured outcome of a pending `manual` query (admin)",
    responses={
        **_ERRORS,
        409: {
            "description": "Already complete (change a posted value with "
            "`POST /v1/queries/{id}/corrections`), or not a manual dataset."
        },
    },
)
def post_result(query_id: RowId, body: QueryResult, _admin: AdminDep, session: SessionDep) -> QueryPublic:
    return query_public(query_service.post_result(session, query_id, body.y), admin=True)
