"""The lab's endpoints for ``manual`` datasets (admin): the queries waiting for a measurement across
releases, measurements in bulk from a CSV, and corrections of posted values; and the corrections of a
release (admin, or the granted partner: its supersessions)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, File, Form, UploadFile
from fastapi import Query as QueryParam

from curator_service import lab_repository as lab_repo
from curator_service.api.deps import AdminDep, ComponentsDep, PrincipalDep, RowId, SessionDep
from curator_service.schemas import correction_public, query_public
from curator_service.services import corrections as correction_service
from curator_service.services import lab as lab_service
from curator_service.services import queries as query_service
from curator_service.services.bulkcsv import parse_measurements
from curator_service.services.releases import get_release
from shared.protocol.schemas import (
    ID_MAX,
    CorrectionsPublic,
    LabQueriesPublic,
    LabStatus,
    QueryCorrectionCreate,
    QueryPublic,
    ResultsPosted,
)

router = APIRouter(tags=["queries"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "Missing or invalid token."},
    403: {"description": "A partner token (this endpoint is admin-only)."},
}
LIMIT_MAX = 10_000


@router.get(
    "/v1/queries",
    response_model=LabQueriesPublic,
    summary="The lab's list: queries of manual datasets across releases, with sample ids (admin)",
    description="`status=pending` (the default): the queries waiting for a measurement, oldest first (cached "
    "repeats, answered with the measurement of the query they repeat, are left out); `status=complete`: the "
    "measured ones. Each names its release, dataset, row `index` and, when the dataset was uploaded with an "
    "`id_column`, the row's `sample_id` (never shown to a partner). Page with `after_id` (the last id seen).",
    responses=_ERRORS,
)
def list_lab_queries(
    _admin: AdminDep,
    session: SessionDep,
    components: ComponentsDep,
    status: Annotated[LabStatus, QueryParam(description="pending or complete.")] = "pending",
    release_id: Annotated[int | None, QueryParam(ge=1, le=ID_MAX, description="Only this release.")] = None,
    dataset_id: Annotated[int | None, QueryParam(ge=1, le=ID_MAX, description="Only this dataset.")] = None,
    after_id: Annotated[int | None, QueryParam(ge=0, le=ID_MAX, description="Queries after this id.")] = None,
    limit: Annotated[int, QueryParam(ge=1, le=LIMIT_MAX)] = 1000,
) -> LabQueriesPublic:
    data = lab_service.lab_queries(
        session,
        components.store,
        status=status,
        release_id=release_id,
        dataset_id=dataset_id,
        after_id=after_id,
        limit=limit,
    )
    return LabQueriesPublic(data=data, count=len(data))


@router.post(
    "/v1/queries/results",
    response_model=ResultsPosted,
    summary="Post measurements in bulk from a CSV, all or nothing (admin)",
    description="A CSV (UTF-8, comma-separated, header first) with a column `y` and, naming each line's "
    "query, `query_id`, `sample_id` (the dataset's id column) or `index` (row index; needs a release); "
    "optionally `release_id` (per line, else the form field). Other columns are ignored. A `sample_id` or "
    "`index` line answers every pending query about that row (of its release, or of every release of the "
    "dataset). All lines are checked, then posted in one transaction: any bad line (a bad value, an unknown "
    "sample, a query already answered, a query named twice) is a 4xx naming the line, and nothing is "
    "posted. At most 100,000 lines, within the request body limit (POBO_CURATOR_MAX_JSON_BYTES).",
    responses={
        **_ERRORS,
        409: {"description": "A line names a query that is already complete: nothing posted."},
        410: {"description": "A line names a release whose dataset was erased: nothing posted."},
        413: {"description": "The file is larger than the request body limit."},
        422: {"description": "A bad line (named), or a bad header: nothing posted."},
    },
)
def post_results(
    _admin: AdminDep,
    session: SessionDep,
    components: ComponentsDep,
    file: Annotated[UploadFile, File(description="CSV: y and one of query_id, sample_id, index.")],
    release_id: Annotated[
        int | None,
        Form(
            ge=1,
            le=ID_MAX,
            description="The release of lines that name no release_id themselves.",
            examples=[3],
        ),
    ] = None,
) -> ResultsPosted:
    measurements = parse_measurements(file.file.read(), release_id)
    lines, answered = lab_service.post_measurements(session, components.store, measurements)
    return ResultsPosted(
        count=len(answered), lines=lines, queries=[query_public(q, admin=True) for q in answered]
    )


@router.post(
    "/v1/queries/{query_id}/corrections",
    status_code=201,
    response_model=QueryPublic,
    summary="Change a posted measurement: corrected before delivery, superseded after (admin)",
    description="For a complete query of a `manual` dataset. While no partner has been sent the query "
    "complete (`delivered_at` null) the value is **corrected**: replaced, and the partner only ever sees the "
    "new one. Once it was sent, the new value **supersedes** it: the partner keeps what it had and sees the "
    "change in the query's `corrections` (and in `GET /v1/releases/{id}/corrections`); under output "
    "privacy it is a new CTL answer, charged to the person like any answer, and refused (409, nothing "
    "recorded) when the grant's `max_epsilon_per_row` has no room for it. Either way both values are kept "
    "as a new link of the release's hash-chained query log (the chain verifies before and after). Cached "
    "repeats of the query change with it. Answers the query as the admin sees it.",
    responses={
        **_ERRORS,
        404: {"description": "No such query."},
        410: {"description": "The query's dataset was erased."},
        409: {
            "description": "The query is pending (post its result instead), a cached repeat (correct the "
            "query it repeats), of a column dataset, or its grant's output allotment for the person is "
            "used up: nothing recorded."
        },
    },
)
def correct_result(
    query_id: RowId, body: QueryCorrectionCreate, _admin: AdminDep, session: SessionDep
) -> QueryPublic:
    correction_service.correct(session, query_id, body.y, body.reason)
    view = query_service.view(session, _admin, query_id)
    return query_public(view.query, admin=True, corrections=view.corrections)


@router.get(
    "/v1/releases/{release_id}/corrections",
    response_model=CorrectionsPublic,
    summary="Changed outcomes of a release's queries, in the order recorded (admin; partner: its own)",
    description="A partner sees the supersessions of its own queries (values it had been sent, and the "
    "values that replaced them): what its audit log should record beside the first answer. The admin sees "
    "corrections made before delivery too, with their reasons. Page with `after_id`.",
    responses={
        **_ERRORS,
        403: {"description": "Not granted."},
        404: {"description": "No such release."},
        410: {"description": "The release's dataset was erased: `release N was erased: ...`."},
    },
)
def list_corrections(
    release_id: RowId,
    principal: PrincipalDep,
    session: SessionDep,
    after_id: Annotated[
        int | None, QueryParam(ge=0, le=ID_MAX, description="Corrections after this id.")
    ] = None,
    limit: Annotated[int, QueryParam(ge=1, le=LIMIT_MAX)] = 1000,
) -> CorrectionsPublic:
    get_release(session, principal, release_id)  # 404 alike for missing and ungranted
    found = lab_repo.list_corrections(
        session,
        release_id,
        partner_id=None if principal.is_admin else principal.partner_id,
        kinds=None if principal.is_admin else lab_repo.PARTNER_KINDS,
        after_id=after_id,
        limit=limit,
    )
    data = [correction_public(c, admin=principal.is_admin) for c in found]
    return CorrectionsPublic(data=data, count=len(data))
