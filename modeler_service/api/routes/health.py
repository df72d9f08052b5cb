"""``GET /healthz``: open, reports database reachability (the kit's route, under the tag "operations")."""

from __future__ import annotations

from fastapi import Request

from modeler_service.api.deps import Components
from shared.servicekit.db import Database
from shared.servicekit.health import health_router


def _database(request: Request) -> Database:
    components: Components = request.app.state.components
    return components.ctx.db


router = health_router(_database, tag="operations", service="modeler")
