"""The modeler service: FastAPI app factory, error mapping, start-up (migrations, recovery) and ``serve``."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from cryptography.fernet import Fernet
from fastapi import Depends, FastAPI
from fastapi_offline import FastAPIOffline

from modeler_service import repository as repo
from modeler_service import service
from modeler_service.api.deps import Components, TokenDep
from modeler_service.api.lanes import step_lane
from modeler_service.api.routes import federations, health, strategies, studies
from modeler_service.config import Settings
from modeler_service.console import build_console
from modeler_service.context import ClientFactory, Context, default_client_factory
from modeler_service.db import Database, transaction
from modeler_service.federations.closer import RoundCloser
from modeler_service.federations.instances import InstanceTracker
from modeler_service.metrics import domain_series
from modeler_service.models import utcnow
from modeler_service.runner import RunnerRegistry, Stepper
from shared.bo.backend import set_dask_backend
from shared.bo.factor import set_default_spill_directory
from shared.errors import InputDataError, PoboError, StrategyError
from shared.servicekit import lanes, serving
from shared.servicekit.app import add_access_guards
from shared.servicekit.asgi_guards import BodyLimit
from shared.servicekit.errors import API_VERSION, document_validation_errors
from shared.servicekit.handlers import install_error_handlers
from shared.servicekit.metrics import ServiceMetrics, install_metrics, metric_tokens
from shared.servicekit.serving import configure_logging, reset_throttle
from shared.servicekit.write_gate import WriteGate, admission

log = logging.getLogger("pobo.modeler")

DESCRIPTION = """
The **modeler** side of pobo (privacy-preserving outsourced Bayesian optimization, PO-GP-UCB).

A *study* runs an optimisation strategy (GP-UCB, batch GP-UCB, random, ...: `GET /v1/strategies`) over the
rows Z of a curator's differentially private release, in rounds: the strategy chooses one or more rows, the
modeler asks the curator for their outcomes (by index only) and records the answers. Every curator query is
logged in an append-only, hash-chained audit log that both organisations can reconcile with the curator's
own query log.

Every `/v1` call needs `Authorization: Bearer <token>` (setting `POBO_MODELER_TOKEN`; if unset, generated on
first start into `<data dir>/token`). Errors are `{"detail": "..."}`.

A *federation* (DP-FTS-DE) makes the modeler the coordinator of hospitals' agents: each agent calls
`/v1/federations/{id}...` with its own agent token (issued once by `POST /v1/federations/{id}/agents`),
which reads and submits to that federation only.
"""

TAGS = [
    {"name": "studies", "description": "Studies over curator releases: step, run, audit, results."},
    {
        "name": "strategies",
        "description": "The registry of strategies a study can run, with their parameters.",
    },
    {
        "name": "federations",
        "description": "DP-FTS-DE federations: the modeler coordinates, hospitals' agents submit (issue 16). "
        "Agent tokens read and submit to their own federation only.",
    },
    {"name": "operations", "description": "Health check."},
]


#: Environment variable through which the supervisor of a multi-worker server hands its crash-recovery
#: result to the workers it spawns (internal; not a setting).
RECOVERED_ENV = "_POBO_MODELER_RECOVERED"


@dataclass(frozen=True)
class Recovered:
    """Studies that a killed process left running, made ``ready`` by ``start_up`` at time ``at``."""

    study_ids: list[str]
    at: datetime

    def to_env(self) -> str:
        return json.dumps({"study_ids": self.study_ids, "at": self.at.isoformat()})

    @classmethod
    def from_env(cls, value: str | None) -> Recovered:
        if not value:
            return cls([], utcnow())
        data = json.loads(value)
        return cls([str(i) for i in data["study_ids"]], datetime.fromisoformat(data["at"]))


def start_up(settings: Settings) -> Recovered:
    """The one-time start-up work: data dir, token and key files, migrations, stale studies made ready.

    Runs once per start, before any request is served: in ``create_app`` for a single process, in the
    supervisor before it spawns the workers otherwise (a worker restarted later must not take the studies
    its siblings are running for stale ones).
    """
    settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    settings.resolve_token()
    settings.resolve_secret_key()
    reset_throttle(settings.data_dir)
    db = Database(settings.resolved_database_url())
    try:
        db.migrate()
        with transaction(db) as session:
            stale = service.recover_stale(session)
    finally:
        db.dispose()
    if stale:
        log.warning("%d study(ies) left running by a previous process are resumable: %s", len(stale), stale)
    return Recovered(stale, utcnow())


def _start_backend(settings: Settings) -> Any:
    """With ``backend: dask``: a client of the modeler's cluster, made the GP-UCB loops' backend for this
    process (``shared.bo.backend``); None with the local backend."""
    if settings.backend != "dask":
        return None
    client = settings.dask_client()
    reads = settings.dask_workers_read_data_dir
    set_dask_backend(
        client,
        settings.dask_partitions,
        workers_read_files=settings.dask_local_cluster if reads is None else reads,
    )
    log.info("GP-UCB loops run on the Dask cluster at %s", client.scheduler_info().get("address"))
    return client


def create_app(
    settings: Settings | None = None,
    *,
    client_factory: ClientFactory | None = None,
    recovered: Recovered | None = None,
) -> FastAPI:
    """Build the app: data dir, secrets, database migrated to head, stale studies made resumable.

    ``client_factory(curator_url, token)`` returns the ``CuratorClient`` a study uses (tests plug in one
    with an ``httpx.MockTransport``). ``recovered``: ``start_up`` already ran (a worker process); else it
    runs here. With ``resume_on_start`` the recovered studies' runs restart in the lifespan; of several
    workers, the one whose claim succeeds first runs each.
    """
    settings = settings or Settings()
    worker = recovered is not None  # one of several workers: the supervisor ran the start-up work
    if recovered is None:
        recovered = start_up(settings)
    set_default_spill_directory(settings.data_dir / "factor-spill")  # GP factors too large for memory
    token = settings.resolve_token()
    fernet = Fernet(settings.resolve_secret_key().get_secret_value().encode("ascii"))
    db = Database(settings.resolved_database_url())
    ctx = Context(
        settings=settings,
        db=db,
        fernet=fernet,
        client_factory=client_factory or default_client_factory(settings),
    )
    stepper = Stepper(ctx)
    runners = RunnerRegistry(ctx, stepper)
    closer = RoundCloser(ctx)  # closes federation rounds at their deadlines (first pass at start-up)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        cluster = _start_backend(settings)
        if settings.resume_on_start:
            for study_id in recovered.study_ids:
                with transaction(db) as session:
                    study = service.get_study(session, study_id)
                    target = study.iterations_total if study.run_target is None else study.run_target
                    # Only if untouched since the recovery: a study run or stepped since then is not ours.
                    claimed = study.iterations_done < study.iterations_total and repo.claim_study(
                        session,
                        study_id,
                        from_statuses=("ready",),
                        to_status="running",
                        run_target=target,
                        not_updated_after=recovered.at,
                    )
                if claimed:
                    runners.start(study_id)
        closer.start()
        yield
        closer.stop()
        runners.stop_all()
        if cluster is not None:
            set_dask_backend(None)
            cluster.close()
        ctx.cache.close()
        db.dispose()

    gate = WriteGate()
    # FastAPIOffline: /docs and /redoc serve their assets from the package, not a CDN (air-gapped sites).
    app = FastAPIOffline(
        title="pobo modeler",
        version=API_VERSION,
        description=DESCRIPTION,
        openapi_tags=TAGS,
        lifespan=lifespan,
        dependencies=[Depends(admission(gate), scope="function")],  # writers: see ``write_gate``
    )
    app.state.write_gate = gate
    app.state.components = Components(ctx=ctx, stepper=stepper, runners=runners, token=token)
    app.state.federation_closer = closer
    app.state.agent_instances = InstanceTracker()  # two processes on one agent token (federations.instances)
    install_error_handlers(
        app,
        logger=log,
        library_errors={InputDataError: 422, StrategyError: 409, PoboError: 400},
        unavailable_detail="the database is unavailable; retry shortly",
        unexpected_detail="internal server error; see the modeler log",
    )
    app.include_router(health.router)
    for router in (studies.router, strategies.router):
        app.include_router(
            router,
            dependencies=[TokenDep],
            responses={
                401: {"description": "Missing or invalid bearer token."},
                413: {"description": "Request body over the limit (setting MAX_JSON_BYTES)."},
                429: {"description": "Too many invalid tokens from this client; see Retry-After."},
                503: {"description": "The database is unavailable; retry after Retry-After seconds."},
            },
        )
    app.include_router(
        federations.router,  # the modeler token or an agent token (checked by the routes' PrincipalDep)
        responses={
            401: {"description": "Missing or invalid bearer token (modeler or agent)."},
            413: {"description": "Request body over the limit (setting MAX_JSON_BYTES)."},
            429: {"description": "Too many invalid tokens from this client; see Retry-After."},
            503: {"description": "The database is unavailable; retry after Retry-After seconds."},
        },
    )
    lanes.install(app, [step_lane(app.state.components, gate)])  # a study's step, past routing (api.lanes)
    if settings.console:  # the modeler team's browser console
        build_console(settings, token.get_secret_value()).install(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_json_bytes)
    metrics = ServiceMetrics(domain_series(db))
    add_access_guards(
        app,
        settings,
        operator_token=token.get_secret_value(),  # bad tokens from the same address never lock it out
        worker=worker,  # count failed tokens with sibling workers
        cors_methods=["GET", "POST"],
        cors_headers=["Authorization", "Content-Type", "Idempotency-Key"],
        on_failure=metrics.auth_failures.inc,
    )
    install_metrics(app, metrics, tokens=metric_tokens(settings, token), operator="modeler token")
    document_validation_errors(app)
    return app


def worker_app() -> FastAPI:
    """The app of one worker process (``pobo modeler serve --workers N``): settings from the environment,
    the supervisor's ``start_up`` result from ``RECOVERED_ENV``."""
    configure_logging()
    return create_app(Settings(), recovered=Recovered.from_env(os.environ.get(RECOVERED_ENV)))


def serve(host: str | None = None, port: int | None = None, workers: int | None = None) -> None:
    """``pobo modeler serve``: start-up work once, then serve with uvicorn until SIGINT/SIGTERM."""
    configure_logging()
    settings = Settings()

    def before_workers() -> None:
        os.environ[RECOVERED_ENV] = start_up(settings).to_env()  # inherited by the spawned workers

    app = partial(create_app, settings)
    serving.serve(
        settings,
        (host, port, workers),
        single_app=app,
        before_workers=before_workers,
    )
