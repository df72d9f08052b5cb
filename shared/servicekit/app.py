"""The outer layers both services put around their FastAPI app: CORS (closed unless origins are named)
and the failed-token throttle (``asgi_guards.AuthThrottle``), added last so that they run first. The
throttle's failure log is kept on ``app.state.auth_failures`` for the console's sign-in form."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from shared.servicekit.asgi_guards import AuthThrottle, FailureLog, failure_log
from shared.servicekit.serving import THROTTLE_FILE
from shared.servicekit.settings import ServiceSettings
from shared.servicekit.tokens import is_token

__all__ = ["AuthFailures", "add_access_guards"]


@dataclass(frozen=True)
class AuthFailures:
    """The service's failed-token log (the API's throttle), for sign-in paths that carry the token in a body
    (the console's sign-in form): they consult and add to the same count as the API."""

    log: FailureLog
    clock: Callable[[], float]
    max_failures: int

    def locked_for(self, client: str) -> float:
        return 0.0 if self.max_failures <= 0 else self.log.locked_for(client, self.clock())

    def record(self, client: str) -> None:
        if self.max_failures > 0:
            self.log.record(client, self.clock())


class _Counting:
    """A failure log that also reports each failure it records."""

    def __init__(self, log: FailureLog, on_failure: Callable[[], None]) -> None:
        self.log = log
        self.on_failure = on_failure

    def locked_for(self, client: str, now: float) -> float:
        return self.log.locked_for(client, now)

    def record(self, client: str, now: float) -> None:
        self.log.record(client, now)
        self.on_failure()


def add_access_guards(
    app: FastAPI,
    settings: ServiceSettings,
    *,
    operator_token: str,
    worker: bool,
    cors_methods: Sequence[str],
    cors_headers: Sequence[str],
    on_failure: Callable[[], None] | None = None,
) -> None:
    """Add CORS (only when ``settings.cors_origins`` names origins: no CORS headers otherwise) and the
    throttle, in that order, as the outermost middleware of ``app``.

    ``worker``: one of several worker processes, which count failed tokens together in a file of the data
    dir. ``operator_token`` is never locked out by bad tokens from its address. ``on_failure`` is called at
    each failure the throttle or the console's sign-in records (the metrics' failed sign-ins).
    """
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=list(cors_methods),
            allow_headers=list(cors_headers),
        )
    failures, clock = failure_log(
        max_failures=settings.auth_max_failures,
        window_seconds=settings.auth_window_seconds,
        shared_file=settings.data_dir / THROTTLE_FILE if worker else None,
    )
    if on_failure is not None:
        failures = _Counting(failures, on_failure)
    app.state.auth_failures = AuthFailures(failures, clock, settings.auth_max_failures)  # the console's too
    app.add_middleware(
        AuthThrottle,
        max_failures=settings.auth_max_failures,
        window_seconds=settings.auth_window_seconds,
        exempt=is_token(operator_token),
        failures=failures,
        clock=clock,
    )
