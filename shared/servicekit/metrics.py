"""``GET /metrics`` of both services: Prometheus text format (prometheus-client), behind the service's
operator token or its ``metrics_token`` setting.

Three kinds of series:

* **HTTP**, counted by :class:`MetricsMiddleware`, the outermost layer (so throttled and refused requests
  count too): ``pobo_http_requests_total{method, route, status}`` and the latency histogram
  ``pobo_http_request_duration_seconds{method, route}``. ``route`` is the route's template
  (``/v1/releases/{release_id}/queries``), never the path itself, so ids never become labels; a request
  no route matches is ``unmatched``.
* **Failed sign-ins**: ``pobo_auth_failures_total``, every failed-token answer (401) of the API and every
  refused console sign-in: what the throttle counts (``app.add_access_guards``).
* **Domain** series, read from the database at each scrape by the service's ``domain`` function (the
  curator's queries answered and budgets; the modeler's studies by status and rounds closed).

The HTTP and sign-in series live in the memory of the process that served the requests: with several
uvicorn workers a scrape reaches one worker and sees that worker's counts (docs/operations.md, "Metrics").
The domain series come from the database and are the same whichever worker answers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Annotated

from fastapi import Depends, FastAPI
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from pydantic import SecretStr
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.servicekit.exceptions import Unauthorized
from shared.servicekit.settings import ServiceSettings
from shared.servicekit.tokens import is_token

__all__ = ["METRICS_PATH", "MetricsMiddleware", "ServiceMetrics", "install_metrics", "metric_tokens"]

METRICS_PATH = "/metrics"
#: Latency buckets (seconds): the hot paths answer in a few ms, an upload or a release may take minutes.
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
UNMATCHED = "unmatched"
#: The text format ``generate_latest`` writes (version 0.0.4: what every Prometheus server reads).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: The service's domain series, computed at scrape time (each call opens and closes its own session).
DomainSeries = Callable[[], Iterable[Metric]]


class _Domain(Collector):
    def __init__(self, series: DomainSeries) -> None:
        self.series = series

    def collect(self) -> Iterable[Metric]:
        return list(self.series())


class ServiceMetrics:
    """One service's registry (its own, not prometheus-client's global one: two apps in one process, as in
    the tests, never share counts)."""

    def __init__(self, domain: DomainSeries | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter(
            "pobo_http_requests",
            "HTTP requests answered, by method, route template and status.",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "pobo_http_request_duration_seconds",
            "Time from a request's arrival to the end of its response, by method and route template.",
            ["method", "route"],
            buckets=BUCKETS,
            registry=self.registry,
        )
        self.auth_failures = Counter(
            "pobo_auth_failures",
            "Failed sign-ins: API requests answered 401 for a bad token, and refused console sign-ins.",
            registry=self.registry,
        )
        if domain is not None:
            self.registry.register(_Domain(domain))

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _route_template(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str):
        return path
    lane = scope.get("pobo.lane_route")  # a fast lane took it (``lanes``): the route it stands in for
    return lane if isinstance(lane, str) else UNMATCHED


class MetricsMiddleware:
    """Counts every HTTP request by route template and status, and times it (pure ASGI: no body copies)."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            self.metrics.observe(scope["method"], _route_template(scope), status, time.perf_counter() - start)


_BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="MetricsBearer",
    description="The service's operator token, or its `metrics_token` setting.",
)
_Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]


def metric_tokens(settings: ServiceSettings, operator_token: SecretStr) -> list[str]:
    """The tokens that read ``GET /metrics``: the operator token, and the ``metrics_token`` setting if set."""
    tokens = [operator_token.get_secret_value()]
    if settings.metrics_token is not None:
        tokens.append(settings.metrics_token.get_secret_value())
    return tokens


def install_metrics(app: FastAPI, metrics: ServiceMetrics, *, tokens: list[str], operator: str) -> None:
    """``GET /metrics`` on ``app`` for a bearer of any of ``tokens`` (the operator token, and the
    ``metrics_token`` setting when set), and the middleware that counts requests (add it last of all
    middleware, so that it is the outermost). ``operator`` names the operator token in the 401's message."""
    checks = [is_token(token) for token in tokens if token]

    @app.get(
        METRICS_PATH,
        tags=["operations"],
        summary=f"Metrics in the Prometheus text format ({operator} or metrics token)",
        description="Requests by route template and status, latency histograms, failed sign-ins and the "
        "service's own series read from its database (docs/operations.md). The HTTP series and failed "
        "sign-ins are those of the worker process that answers.",
        response_class=Response,
        responses={
            200: {"content": {CONTENT_TYPE: {}}, "description": "Prometheus text format 0.0.4."},
            401: {"description": f"Missing or invalid token (the {operator} or the metrics token)."},
        },
    )
    def metrics_endpoint(
        credentials: _Credentials,
    ) -> Response:
        token = credentials.credentials if credentials is not None else ""
        if not token or not any(check(token) for check in checks):
            raise Unauthorized(
                f"GET /metrics needs the {operator} or the metrics token (Authorization: Bearer)"
            )
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    app.add_middleware(MetricsMiddleware, metrics=metrics)
