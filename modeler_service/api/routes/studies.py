"""Studies: create, inspect, step, run in the background, audit, plot (``API.md``, modeler part).

Routes are sync (``def``): FastAPI runs them in its thread pool, so the GP arithmetic and the blocking
curator calls never run on the event loop.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Body, Query, Response, status

from modeler_service import results, runner, service, supersessions
from modeler_service.api.deps import ComponentsDep, ContextDep, SessionDep
from modeler_service.api.lanes import step_json
from modeler_service.db import transaction
from modeler_service.schemas import (
    AuditLog,
    AuditSync,
    AuditVerification,
    RunAccepted,
    RunRequest,
    StepResult,
    StudiesPublic,
    StudyCreate,
    StudyPublic,
    StudyUpdate,
)

router = APIRouter(prefix="/v1/studies", tags=["studies"])

_ERRORS: dict[int | str, dict[str, str]] = {
    404: {"description": "No such study"},
    409: {"description": "The study's state does not allow this (running, awaiting a measurement, done)"},
}


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    summary="Create a study over a curator release or gradient oracle",
    responses={
        404: {"description": "The curator has no such release or gradient oracle (or did not grant it)"},
        502: {"description": "The curator failed, refused the token, or sent rows that do not match"},
    },
)
def create_study(body: StudyCreate, session: SessionDep, ctx: ContextDep) -> StudyPublic:
    """A strategy that runs on a release (``release_id``): downloads the release's rows Z as .npy, verifies
    their sha256, stores them, and creates the study. A strategy that runs on a gradient oracle (``dp-gibo``,
    ``gradient_oracle_id``): reads the oracle's public parameters, checks that ``iterations`` fits the steps
    it has left (422 otherwise) and that ``strategy_params`` fit its bounds, and creates the study.

    The curator token is stored encrypted and never returned.
    """
    return service.to_public(service.create_study(session, ctx, body))


@router.get(
    "",
    summary="List studies (all, or by name and tags)",
    responses={422: {"description": "A tag filter that is not a valid tag"}},
)
def list_studies(
    session: SessionDep,
    name: Annotated[
        str | None,
        Query(max_length=200, description="Only studies whose name contains this text, ignoring case."),
    ] = None,
    tag: Annotated[
        list[str] | None,
        Query(
            description="Only studies with this tag, ignoring case; repeat it (`?tag=a&tag=b`) for studies "
            "with every one of them.",
        ),
    ] = None,
) -> StudiesPublic:
    """Every study, oldest first; ``name`` and ``tag`` narrow the list (both: studies that match both)."""
    return service.list_studies(session, name=name, tags=tag)


@router.get("/{study_id}", summary="A study: status, progress, best row", responses=_ERRORS)
def get_study(study_id: str, session: SessionDep, ctx: ContextDep) -> StudyPublic:
    return service.study_detail(session, ctx, study_id)


@router.patch(
    "/{study_id}",
    summary="Change a study: a rotated partner token, a new budget, its name or tags",
    responses={
        **_ERRORS,
        422: {
            "description": "Nothing to change, a budget below what was made or beyond the grant, a bad token"
        },
        502: {"description": "The curator failed"},
    },
)
def update_study(study_id: str, body: StudyUpdate, ctx: ContextDep) -> StudyPublic:
    """``curator_token``: the partner's new token after a rotation at the curator (checked against the
    curator; a running study uses it from its next request on). ``iterations``: the study's new budget, at
    least what it has made and, when raised, within what the curator's grant has left (the partner's quota,
    the oracle's steps); a done study with a larger budget is ready again: ``POST .../run`` resumes it.
    ``name`` and ``tags``: a new name (null removes it) and tags (replacing all; ``[]`` removes them), in any
    status, without asking the curator."""
    study = service.update_study(ctx, study_id, body)
    with transaction(ctx.db, write=False) as session:
        return service.to_public(service.get_study(session, study.id))


@router.post(
    "/{study_id}/step",
    summary="One iteration: suggest -> curator query -> observe",
    response_model=StepResult,
    responses={**_ERRORS, 429: {"description": "The curator's query quota is used up"}},
)
def step(study_id: str, components: ComponentsDep) -> Response:
    """Runs one iteration now. If the curator's outcome is ``manual`` (the query is pending), the answer has
    ``status: "pending"`` and ``y: null``; the study becomes ``awaiting_measurement`` and records the value
    by itself when the curator's operator posts it.
    """
    # The fast lane (``api.lanes``) takes this request before it gets here when it carries the modeler
    # token. Serialised here, in the route's worker thread, into the JSON FastAPI would send for the
    # ``StepResult``: FastAPI would otherwise re-validate the model in a second hop to the thread pool.
    return Response(step_json(components, study_id), media_type="application/json")


@router.post(
    "/{study_id}/run",
    status_code=status.HTTP_202_ACCEPTED,
    summary="Run iterations in the background",
    responses={**_ERRORS, 422: {"description": "More iterations than the budget has left"}},
)
def run(
    study_id: str,
    components: ComponentsDep,
    body: Annotated[RunRequest | None, Body()] = None,
) -> RunAccepted:
    """Starts (202) a background runner for ``iterations`` more iterations (default: the rest of the budget).

    Progress is in ``GET /v1/studies/{id}``. A second ``run`` while one is running is a 409.
    """
    return runner.start_run(components.ctx, components.runners, study_id, body.iterations if body else None)


@router.post(
    "/{study_id}/stop",
    summary="Stop a running study after the round in flight",
    responses={
        404: {"description": "No such study"},
        409: {"description": "The study is not running (ready, done or failed)"},
    },
)
def stop(study_id: str, session: SessionDep) -> StudyPublic:
    """Asks the study's background run to stop after the round in flight: its ``run_target`` becomes
    ``iterations_done`` (the runner checks it before every round, in whichever worker runs it), so the
    answer still says ``running`` and the study becomes ``ready`` (``done`` if that round used the budget)
    once the round is recorded; ``run`` resumes it later. A study ``awaiting_measurement`` stops once that
    round's measurements arrive from the curator; one ``waiting_for_curator`` after its retried round.
    A study that is not running (``ready``, ``done``, ``failed``) is a 409.
    """
    return service.to_public(service.stop_run(session, study_id))


@router.get(
    "/{study_id}/audit",
    response_model=AuditLog,
    summary="The audit log (one hash-chained entry per curator query)",
    responses={**_ERRORS, 200: {"content": {"text/csv": {}}, "description": "JSON, or CSV with ?format=csv"}},
)
def audit(
    study_id: str,
    session: SessionDep,
    format: Annotated[Literal["json", "csv"], Query(description="json (default) or csv")] = "json",  # noqa: A002
) -> AuditLog | Response:
    if format == "csv":
        return Response(
            results.audit_csv(session, study_id),
            media_type="text/csv",
            headers={"Content-Disposition": f'attachment; filename="audit-{study_id}.csv"'},
        )
    return results.audit_log(session, study_id)


@router.get(
    "/{study_id}/audit/verify",
    summary="Recompute the hash chain; report the first bad entry",
    responses=_ERRORS,
)
def verify(study_id: str, session: SessionDep) -> AuditVerification:
    """Both chains of the audit log: the entries' and the supersessions'; ``ok`` only if both verify."""
    return results.verify_audit(session, study_id)


@router.post(
    "/{study_id}/audit/sync",
    summary="Record the curator's supersessions of the study's values now",
    responses={
        **_ERRORS,
        422: {"description": "The curator refused the study's partner token"},
        502: {"description": "The curator failed"},
    },
)
def sync_audit(study_id: str, ctx: ContextDep) -> AuditSync:
    """Asks the curator for the supersessions of the study's queries (``GET /v1/releases/{id}/corrections``
    with the study's partner token: values the study had been sent that the lab changed since) and records
    each one the audit log lacks, beside the entry it supersedes, in one transaction; a repeat records
    nothing more. The strategy uses the new values from its next round. The runner does the same after
    every round that waited for a measurement; this is for a change made later (and for ``pobo
    reconcile``). A study that asks no release's queries has none (``recorded`` 0).
    """
    with transaction(ctx.db, write=False) as session:
        study = service.get_study(session, study_id)
    return supersessions.sync_supersessions(ctx, study)


@router.get(
    "/{study_id}/plot.png",
    response_class=Response,
    summary="Best value so far vs iteration (PNG)",
    responses={**_ERRORS, 200: {"content": {"image/png": {}}}},
)
def plot(study_id: str, session: SessionDep) -> Response:
    return Response(results.plot_png(session, study_id), media_type="image/png")
