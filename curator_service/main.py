"""The curator service: ``create_app(settings)`` builds the FastAPI app; ``serve`` runs it with uvicorn."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse
from fastapi_offline import FastAPIOffline
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from curator_service import csvparse
from curator_service import repository as repo
from curator_service.api.deps import Components
from curator_service.api.lanes import query_lane
from curator_service.api.routes import (
    access_log,
    datasets,
    gradients,
    health,
    lab,
    partners,
    populations,
    queries,
    releases,
)
from curator_service.config import Settings
from curator_service.console import build_console
from curator_service.console.upload_limit import UPLOAD_PATH as CONSOLE_UPLOAD_PATH
from curator_service.console.upload_limit import ConsoleUploadLimit
from curator_service.db import Database
from curator_service.metrics import domain_series
from curator_service.services import datasets as dataset_service
from curator_service.services import erasure as erasure_service
from curator_service.services import queries as query_service
from curator_service.services import retention
from curator_service.services.access_log import PendingEntry
from curator_service.services.auth import authenticate
from curator_service.services.releases import ComputeBackend
from curator_service.storage import ArrayStore
from shared.errors import InputDataError, PrivacyBudgetExceeded
from shared.servicekit import lanes, serving
from shared.servicekit.app import add_access_guards
from shared.servicekit.asgi_guards import BodyLimit
from shared.servicekit.console import Console
from shared.servicekit.errors import API_VERSION, document_validation_errors
from shared.servicekit.handlers import install_error_handlers
from shared.servicekit.metrics import ServiceMetrics, install_metrics, metric_tokens
from shared.servicekit.serving import configure_logging, reset_throttle
from shared.servicekit.tokens import hash_token
from shared.servicekit.write_gate import WriteGate, admission

logger = logging.getLogger("curator_service")

DESCRIPTION = """
The **curator** holds the sensitive rows (a hospital, a bank). This service turns a CSV into a
differentially private release, gives a partner (the modeler) scoped access to it, and answers
"what is the outcome of row *i*?" — without ever letting a raw row out.

**Flow.** `POST /v1/datasets` (upload a CSV) → `GET /v1/datasets/{id}/privacy` (what a release protects,
in your units) → `POST /v1/datasets/{id}/releases` (spends budget; the Gaussian mechanism by default) →
`POST /v1/partners` (a token granted that release, with a query quota) → the partner downloads
`GET /v1/releases/{id}/rows` and asks `POST /v1/releases/{id}/queries`.

**Auth.** `Authorization: Bearer <token>` on every `/v1` call: the admin token (setting
`POBO_CURATOR_ADMIN_TOKEN`, or generated on first start into `<data dir>/admin-token`) or a partner token.
Missing/wrong token: 401. A partner token on an admin endpoint or an ungranted release: 403.

**The guarantee.** The default release (`mechanism: "gaussian"`) is (epsilon, delta)-differentially
private for one person's row whose released features move by Euclidean norm <= 1 *in scaled units* (other
columns may differ arbitrarily). The paper's Algorithm 1 (`mechanism: "po-gp-ucb"`) is NOT differentially
private when n > d + 1 (its output lies in the column space of the data); it is released only with
`"acknowledge_no_guarantee": true` and recorded with `formal_guarantee: false`. Outcomes answered to a
partner are disclosed as they are. The upload's `scaling` decides the units:

* `none` (default): the curator's own units are the DP unit.
* a JSON object `{"feature": s, ...}`: column j is divided by the declared scale s_j before anything else
  (features not listed keep s_j = 1). Declare s_j as "how much one person may move feature j"; declared
  scales keep the formal guarantee.
* `max_norm:<c>`: every row is multiplied by c / (largest row norm), the paper's normalisation (c = 25 in
  its experiments). The factor is computed from the data itself, so such releases are **outside the
  formal (epsilon, delta) guarantee**; the dataset and every release record it (`formal_guarantee: false`).

**Budget.** Each dataset belongs to a population (the people in its rows: declared with `population`, or
found when the same rows are uploaded again), and the population has one (epsilon, delta) budget for all its
datasets; releases compose basically (the epsilons add up, so do the deltas). A release that would exceed
it is refused with 409 and nothing is written. delta >= 1/n needs `"allow_large_delta": true`.

Errors are `{"detail": "<message>"}`; no response ever contains a raw feature value.
"""

TAGS = [
    {
        "name": "datasets",
        "description": "Upload CSVs, read metadata, the privacy report and the ledger (admin).",
    },
    {
        "name": "populations",
        "description": "The people behind the datasets: one budget and one ledger per population (admin).",
    },
    {"name": "releases", "description": "DP releases of a dataset: create (admin), read and download."},
    {
        "name": "gradient oracles",
        "description": "DP-GIBO: private gradient steps on a dataset's rows, mu-GDP charged at creation.",
    },
    {"name": "partners", "description": "Partner tokens, their grants and query quotas (admin)."},
    {
        "name": "queries",
        "description": "Outcome queries by partners; the lab's side of manual measurements (admin): the "
        "pending list with sample ids, results one by one or in bulk from a CSV, corrections of posted "
        "values.",
    },
    {
        "name": "access log",
        "description": "Who called what and when (admin). Every `/v1` request gets one entry, refused "
        "ones included, written just after its response; the entry of an answered `column` query is "
        "written in the query's own transaction (on disk with the answer; its `duration_ms` ends just "
        "before that commit).",
    },
    {"name": "health", "description": "Liveness and database reachability."},
]

#: Multipart framing around the CSV (boundaries, the small form fields) allowed on top of the file limit.
UPLOAD_SLACK_BYTES = 1 * 2**20


async def _send_json(
    scope: Scope,
    receive: Receive,
    send: Send,
    status: int,
    detail: str,
    headers: dict[str, str] | None = None,
) -> None:
    response = JSONResponse({"detail": detail}, status_code=status, headers=headers)
    await response(scope, receive, send)


class UploadGuard:
    """For ``POST /v1/datasets``: authenticate and enforce the size limit *before* the body is read.

    An unauthenticated or over-sized upload is answered at once (401/403/413) instead of after spooling
    gigabytes to disk; a body that turns out bigger than announced is cut off with 413 while streaming.
    """

    def __init__(self, app: ASGIApp, components: Components) -> None:
        self.app = app
        self.components = components

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or scope["path"].rstrip("/") != "/v1/datasets"
        ):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            await _send_json(
                scope,
                receive,
                send,
                401,
                "missing bearer token: send the header 'Authorization: Bearer <token>'",
                {"WWW-Authenticate": "Bearer"},
            )
            return
        c = self.components
        principal = await anyio.to_thread.run_sync(authenticate, c.db, c.admin_token_hash, token.strip())
        if principal is None:
            await _send_json(
                scope, receive, send, 401, "invalid or revoked token", {"WWW-Authenticate": "Bearer"}
            )
            return
        scope.setdefault("state", {})["principal"] = principal
        if not principal.is_admin:
            await _send_json(
                scope,
                receive,
                send,
                403,
                "this endpoint needs the curator's admin token; a partner token is not allowed",
            )
            return
        limit = c.settings.max_upload_bytes + UPLOAD_SLACK_BYTES
        too_large = (
            f"the upload is larger than the limit of {c.settings.max_upload_bytes} bytes "
            "(setting POBO_CURATOR_MAX_UPLOAD_BYTES)"
        )
        try:
            announced = int(headers.get("content-length", "-1"))
        except ValueError:
            announced = -1
        if announced > limit:
            await _send_json(scope, receive, send, 413, too_large)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise StarletteHTTPException(status_code=413, detail=too_large)
            return message

        await self.app(scope, limited_receive, send)


class AccessLogMiddleware:
    """Records every ``/v1`` request: who (admin, partner:<id>, anonymous), method, path, status, time; and,
    with the console on, every console action (a request other than GET/HEAD: uploads, releases, partners,
    tokens, grants, measurements, gradient oracles, sign-in and out) with the operator's console session
    as its actor (``admin@console:<tag>``, ``Console.actor_of``). Paths only: never a form's values."""

    def __init__(self, app: ASGIApp, db: Database, gate: WriteGate, console: Console | None = None) -> None:
        self.app = app
        self.db = db
        self.gate = gate  # the entry is a write: it waits for admission like any writer
        self.console = console

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        console_action = self.console is not None and self.console.is_action(scope)
        if scope["type"] != "http" or not (scope["path"].startswith("/v1") or console_action):
            await self.app(scope, receive, send)
            return
        pending = PendingEntry(scope["method"], scope["path"], time.perf_counter())
        scope.setdefault("state", {})["access_log"] = pending  # a route may write it in its own transaction
        status = 500

        async def send_with_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            if not pending.written:
                entry = pending.fields(scope["state"].get("principal"), status)
                if console_action and self.console is not None:
                    entry["actor"] = self.console.actor_of(scope)
                with anyio.CancelScope(shield=True):
                    await self.gate.run_sync(self._write, entry)

    def _write(self, entry: dict[str, Any]) -> None:
        try:
            with self.db.session(write=True) as session:
                repo.add_access_log(session, **entry)
                session.commit()
        except Exception:  # noqa: BLE001 - the log must never break the request
            logger.warning("could not write an access-log entry (%s %s)", entry["method"], entry["path"])


def start_up(settings: Settings) -> None:
    """The one-time start-up work: data dir, admin token file, migrations to head, crash recovery.

    Runs once per start, before any request is served: in ``create_app`` for a single process, in the
    supervisor before it spawns the workers otherwise (so that two workers never sweep or recover at once,
    and a worker restarted later never sweeps files a sibling is writing).
    """
    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # raw rows live here: owner only
    settings.resolve_admin_token()
    reset_throttle(settings.data_dir)
    db = Database(settings.resolved_database_url())
    try:
        db.migrate()
        store = ArrayStore(settings.data_dir)
        erasure_service.sweep_erased(db, store)
        dataset_service.sweep_orphans(db, store, settings.orphan_min_age_seconds)
        query_service.recover_pending_queries(db, store)
    finally:
        db.dispose()


def create_app(settings: Settings | None = None, *, run_start_up: bool = True) -> FastAPI:
    """Build the app: data dir, admin token, database (migrated to head), array store, routes.

    With ``run_start_up`` (the default) migrations and crash recovery (``start_up``) run here,
    synchronously, so the app is ready as soon as this returns (tests can drive it through
    ``httpx.ASGITransport`` without a lifespan); a worker of a multi-process server skips them.
    """
    settings = settings or Settings()
    if run_start_up:
        start_up(settings)
    admin_token = settings.resolve_admin_token()
    db = Database(settings.resolved_database_url())
    store = ArrayStore(settings.data_dir)
    components = Components(
        settings=settings,
        db=db,
        store=store,
        admin_token_hash=hash_token(admin_token.get_secret_value()),
        compute_backend=ComputeBackend.from_settings(settings),  # its Dask client: made at first use
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # access-log retention: a run at start-up, then hourly (one process at a time: services.retention)
        async with retention.periodic_archiving(db, settings.data_dir, settings.access_log_retention_days):
            yield
        db.dispose()
        csvparse.shutdown_pool()
        components.compute_backend.close()

    gate = WriteGate()
    # FastAPIOffline: /docs serves Swagger UI from the package, not a CDN (curators run air-gapped).
    app = FastAPIOffline(
        title="pobo curator",
        version=API_VERSION,
        summary="Differentially private releases, partner access and outcome queries (PO-GP-UCB, curator).",
        description=DESCRIPTION,
        openapi_tags=TAGS,
        lifespan=lifespan,
        dependencies=[Depends(admission(gate), scope="function")],  # writers: see ``write_gate``
    )
    app.state.components = components
    app.state.write_gate = gate  # a read that records a delivery writes through it (``routes.queries``)
    install_error_handlers(
        app,
        logger=logger,
        library_errors={InputDataError: 422, PrivacyBudgetExceeded: 409},
        unavailable_detail="the database is unavailable or busy; retry shortly",
        database_error_detail="internal database error; see the curator's log",
        unexpected_detail="internal error; see the curator's log",
    )
    for module in (health, datasets, populations, releases, gradients, partners, lab, queries, access_log):
        app.include_router(module.router)
    lanes.install(app, [query_lane(components, gate)])  # the iteration's query, past routing (api.lanes)
    console = None
    if settings.console:  # the privacy officer's browser console (admin only)
        console = build_console(settings, admin_token.get_secret_value())
        console.install(app)
        # its CSV upload obeys the upload limit (an HTML 413 page), not the JSON body limit (exempt below)
        app.add_middleware(
            ConsoleUploadLimit,
            max_bytes=settings.max_upload_bytes + UPLOAD_SLACK_BYTES,
            max_upload_bytes=settings.max_upload_bytes,
        )
    app.add_middleware(UploadGuard, components=components)
    app.add_middleware(
        BodyLimit, max_bytes=settings.max_json_bytes, exempt=["/v1/datasets", CONSOLE_UPLOAD_PATH]
    )
    app.add_middleware(AccessLogMiddleware, db=db, gate=gate, console=console)
    metrics = ServiceMetrics(domain_series(db))
    add_access_guards(
        app,
        settings,
        operator_token=admin_token.get_secret_value(),  # bad tokens from the same address never lock it out
        worker=not run_start_up,  # the supervisor ran the start-up: count failed tokens with sibling workers
        cors_methods=["GET", "POST", "DELETE"],
        cors_headers=["Authorization", "Content-Type", "Idempotency-Key"],
        on_failure=metrics.auth_failures.inc,
    )
    install_metrics(app, metrics, tokens=metric_tokens(settings, admin_token), operator="admin token")
    document_validation_errors(app)
    return app


def worker_app() -> FastAPI:
    """The app of one worker process (``pobo curator serve --workers N``): settings from the environment;
    the supervisor has already run ``start_up``."""
    configure_logging()
    return create_app(Settings(), run_start_up=False)


def serve(host: str | None = None, port: int | None = None, workers: int | None = None) -> None:
    """``pobo curator serve``: settings from the environment, start-up work once, then uvicorn."""
    configure_logging()
    settings = Settings()
    app, start = partial(create_app, settings), partial(start_up, settings)
    serving.serve(
        settings,
        (host, port, workers),
        single_app=app,
        before_workers=start,
    )
