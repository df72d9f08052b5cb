"""The outer layers both services put around their FastAPI app: CORS (closed unless origins are named)
and the failed-token throttle (``asgi_guards.AuthThrottle``), added last so that they run first."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from shared.servicekit.asgi_guards import AuthThrottle, is_token
from shared.servicekit.serving import THROTTLE_FILE
from shared.servicekit.settings import ServiceSettings

__all__ = ["add_access_guards"]


def add_access_guards(
    app: FastAPI,
    settings: ServiceSettings,
    *,
    operator_token: str,
    worker: bool,
    cors_methods: Sequence[str],
    cors_headers: Sequence[str],
) -> None:
    """Add CORS (only when ``settings.cors_origins`` names origins: no CORS headers otherwise) and the
    throttle, in that order, as the outermost middleware of ``app``.

    ``worker``: one of several worker processes, which count failed tokens together in a file of the data
    dir. ``operator_token`` is never locked out by bad tokens from its address.
    """
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=list(cors_methods),
            allow_headers=list(cors_headers),
        )
    app.add_middleware(
        AuthThrottle,
        max_failures=settings.auth_max_failures,
        window_seconds=settings.auth_window_seconds,
        shared_file=settings.data_dir / THROTTLE_FILE if worker else None,
        exempt=is_token(operator_token),
    )
