"""GET /healthz: open, reports whether the database answers (the kit's route, under the tag "health")."""

from __future__ import annotations

from curator_service.api.deps import get_components
from shared.servicekit.health import health_router

router = health_router(lambda request: get_components(request).db, tag="health")
