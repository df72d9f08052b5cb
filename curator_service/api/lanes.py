"""The curator's fast lane (``shared.servicekit.lanes``): a partner's ``POST /v1/releases/{id}/queries``
answered in Core (``services.answers``), past FastAPI's routing and dependencies.

The lane takes a request only in the route's common case: a canonical release id, ``Authorization: Bearer``
with a token, a JSON body that ``QueryCreate`` accepts, at most one ``Idempotency-Key`` of at most 200
characters, and an answer from :func:`answer_core` (a raw ``column`` query of a granted partner). It holds
a writer's place in the write gate while it answers, as the route's ``admission`` dependency would, and
answers exactly what the route answers: the same JSON, status 201. Everything else goes on to the route
(``routes.queries.create_query``) with nothing written; a request the lane has tried in Core is marked so
that the route does not try it a second time.
"""

from __future__ import annotations

import re

import anyio.to_thread
from pydantic import ValidationError
from starlette.responses import Response
from starlette.types import Send

from curator_service.api.deps import Components
from curator_service.schemas import query_public
from curator_service.services import answers
from shared.protocol.schemas import QueryCreate
from shared.servicekit.lanes import Lane, LaneRequest, bearer_token, json_content
from shared.servicekit.write_gate import WriteGate

__all__ = ["TRIED_IN_CORE", "answer_core", "query_lane"]

#: ``request.state`` key: the lane tried this request in Core, and Core stepped aside.
TRIED_IN_CORE = "pobo_tried_in_core"
#: The route's path, with the release id as ``RowId`` accepts it in canonical decimal (0 .. 2^31 - 1).
QUERY_PATH = re.compile(r"/v1/releases/(0|[1-9][0-9]{0,9})/queries")
#: ``Header(max_length=...)`` of the route's Idempotency-Key.
KEY_MAX_LENGTH = 200
_ROW_ID_MAX = 2**31 - 1


def answer_core(
    components: Components,
    state: dict[str, object],
    token: str,
    release_id: int,
    index: int,
    idempotency_key: str | None,
) -> bytes | None:
    """The query answered and committed in Core, as the JSON of its ``QueryPublic``; or None (nothing
    written) when Core steps aside. ``state``: ``request.state`` (the access log's pending entry is written
    with the answer; the principal is set once the token is known)."""
    answered = answers.answer_at_once(
        components.db,
        components.store,
        components.admin_token_hash,
        token,
        release_id,
        index,
        idempotency_key,
        state.get("access_log"),  # type: ignore[arg-type]
        lambda principal: state.__setitem__("principal", principal),
    )
    if answered is None:
        return None
    return query_public(answered).model_dump_json(by_alias=True).encode("utf-8")


def query_lane(components: Components, gate: WriteGate) -> Lane:
    """The lane of ``POST /v1/releases/{release_id}/queries``."""

    async def handle(request: LaneRequest, send: Send) -> bool:
        release_id = int(request.match.group(1))
        token = bearer_token(request)
        key = request.header(b"idempotency-key")
        if (
            release_id > _ROW_ID_MAX
            or token is None
            or not json_content(request)
            or (key is not None and len(key) > KEY_MAX_LENGTH)
        ):
            return False
        try:
            body = QueryCreate.model_validate_json(request.body)
        except ValidationError:
            return False  # the route answers its 422
        state = request.state
        async with gate.admitted():
            content = await anyio.to_thread.run_sync(
                answer_core, components, state, token, release_id, body.index, key
            )
        if content is None:
            state[TRIED_IN_CORE] = True
            return False
        await Response(content, status_code=201, media_type="application/json")(
            request.scope, request.receive, send
        )
        return True

    return Lane("POST", QUERY_PATH, handle, read_body=True, route="/v1/releases/{release_id}/queries")
