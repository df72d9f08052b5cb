"""The body of ``GET /healthz``: pure pydantic (no FastAPI), so the wire contract can re-export it
(``shared.protocol.schemas.Health``) without importing the web stack."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

__all__ = ["Health"]


# ok / ok when the database answers; unavailable / unreachable (a 503) when it does not. (No docstring: it
# would become the schema's description in the OpenAPI documents.)
class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    database: Literal["ok", "unreachable"]
    service: Literal["curator", "modeler"] | None = Field(
        default=None,
        description="Which pobo service answers (a client checks it is talking to the one it expects).",
    )
