"""The modeler's fast lane (``shared.servicekit.lanes``): ``POST /v1/studies/{id}/step`` with the modeler
token, past FastAPI's routing and dependencies.

The lane takes the request only when it carries ``Authorization: Bearer`` with the modeler's token (compared
in constant time, as ``require_token`` does); anything else goes on to the route (``routes.studies.step``),
which answers its 401. It holds a writer's place in the write gate while the round runs in the thread pool,
as the route's ``admission`` dependency would, and answers what the route answers: the ``StepResult`` JSON
with status 200, or the error the route would raise, which the app's exception handlers answer the same
way (the lane sits inside them). The route reads no body, and neither does the lane.
"""

from __future__ import annotations

import hmac
import re

import anyio.to_thread
from starlette.responses import Response
from starlette.types import Send

from modeler_service import runner
from modeler_service.api.deps import Components
from shared.servicekit.lanes import Lane, LaneRequest, bearer_token
from shared.servicekit.write_gate import WriteGate

__all__ = ["step_json", "step_lane"]

#: The route's path; ``{study_id}`` as Starlette matches a path parameter (anything but '/').
STEP_PATH = re.compile(r"/v1/studies/([^/]+)/step")


def step_json(components: Components, study_id: str) -> bytes:
    """One round of the study now (``runner.step_now``), as the JSON of its ``StepResult``."""
    result = runner.step_now(components.ctx, components.stepper, components.runners, study_id)
    return result.model_dump_json(by_alias=True).encode("utf-8")


def step_lane(components: Components, gate: WriteGate) -> Lane:
    """The lane of ``POST /v1/studies/{study_id}/step``."""
    expected = components.token.get_secret_value().encode("utf-8")

    async def handle(request: LaneRequest, send: Send) -> bool:
        token = bearer_token(request)
        if token is None or not hmac.compare_digest(token.encode("utf-8"), expected):
            return False  # the route answers its 401 (and the throttle counts it)
        study_id = request.match.group(1)
        async with gate.admitted():
            content = await anyio.to_thread.run_sync(step_json, components, study_id)
        await Response(content, media_type="application/json")(request.scope, request.receive, send)
        return True

    return Lane("POST", STEP_PATH, handle, route="/v1/studies/{study_id}/step")
