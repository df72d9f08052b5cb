"""GET /healthz: open, reports whether the database answers (the kit's route, under the tag "health")."""

from __future__ import annotations

from curator_service.api.deps import components_of
from shared.servicekit.health import health_router

router = health_router(lambda request: components_of(request).db, tag="health", service="curator")
