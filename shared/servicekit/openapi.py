"""Patching a generated OpenAPI document (no FastAPI import: works on any app with ``openapi()`` and
``openapi_schema``, which is how FastAPI caches its document)."""

from __future__ import annotations

from typing import Any


def override_component_schema(app: Any, name: str, schema: dict[str, Any]) -> None:
    """Replace ``components.schemas[name]`` in ``app``'s OpenAPI document (generated lazily, once)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = build()
            document.setdefault("components", {}).setdefault("schemas", {})[name] = schema
            app.openapi_schema = document
        return dict(app.openapi_schema)

    app.openapi = openapi
