"""Queries waiting for a measured outcome (``manual`` datasets): each with its sample id and a form, the
lab's CSV sheet of them, measurements in bulk from a CSV; and the access log."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Annotated

from fastapi import Query as QueryParam
from fastapi import Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.datastructures import UploadFile

from curator_service.console.common import RowId, components, db_session, integer, number, optional_int
from curator_service.models import Dataset, Partner, Query, Release
from curator_service.schemas import access_entry
from curator_service.services import access_log as access_service
from curator_service.services import lab as lab_service
from curator_service.services import queries as query_service
from curator_service.services.bulkcsv import formula_safe, parse_measurements
from shared.protocol.schemas import LabQueryPublic, QueryResult
from shared.servicekit.console import Console, ConsoleRefusal, FormPost, SignedIn
from shared.servicekit.console.auth import ConsoleSession
from shared.servicekit.exceptions import ServiceError

#: At most this many pending queries on the page (oldest first), and access-log entries per page.
PENDING_LIMIT = 500
#: At most this many pending queries in the lab's CSV sheet.
EXPORT_LIMIT = 10_000
#: The sheet's columns (``y`` left empty for the lab).
EXPORT_COLUMNS = (
    "query_id",
    "release_id",
    "dataset_id",
    "dataset",
    "index",
    "sample_id",
    "partner_id",
    "partner",
    "asked_at",
    "y",
)
ACCESS_DEFAULT_LIMIT = 100
ACCESS_MAX_LIMIT = 1000


def pending_manual_queries(session: Session) -> Sequence[tuple[Query, str, str]]:
    """Pending queries of ``manual`` datasets that wait for the curator's measurement, oldest first, with
    their partner's name and their dataset's name. Repeats answered from an earlier query of the same row
    (cached-answer grants) are left out: they are answered with that query's measurement."""
    stmt = (
        select(Query, Partner.name, Dataset.name)
        .join(Release, Release.id == Query.release_id)
        .join(Dataset, Dataset.id == Release.dataset_id)
        .join(Partner, Partner.id == Query.partner_id)
        .where(Query.status == "pending", Dataset.objective_mode == "manual", Query.source_query_id.is_(None))
        .order_by(Query.id)
        .limit(PENDING_LIMIT)
    )
    return [(q, partner, dataset) for q, partner, dataset in session.execute(stmt).all()]


def pending_export(rows: Sequence[LabQueryPublic]) -> str:
    """The pending queries as a CSV sheet for the lab: one line per query with its sample id and an empty
    ``y`` column to fill in (the sheet can be uploaded back as it is: ``POST /console/queries/results``).
    Text cells are formula-safe (a leading ``=``, ``+``, ``-`` or ``@`` is quoted with an apostrophe)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(EXPORT_COLUMNS)
    for q in rows:
        writer.writerow(
            [
                q.id,
                q.release_id,
                q.dataset_id,
                formula_safe(q.dataset_name),
                q.index,
                "" if q.sample_id is None else formula_safe(q.sample_id),
                q.partner_id,
                formula_safe(q.partner_name),
                q.created_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "",
            ]
        )
    return out.getvalue()


def register(console: Console) -> None:
    router = console.router

    def queries_page(
        request: Request, session: ConsoleSession, *, error: str | None = None, status_code: int = 200
    ) -> Response:
        with db_session(request) as s:
            pending = lab_service.lab_queries(
                s, components(request).store, status="pending", limit=PENDING_LIMIT
            )
        flash = console.flash(request, session) if error is None else None
        context = {
            "pending": pending,
            "limit": PENDING_LIMIT,
            "posted": flash.get("posted") if flash else None,
            "error": error,
        }
        page = console.render(request, "queries.html", context, session=session, status_code=status_code)
        return console.forget_flash(page) if flash else page

    @router.get("/queries")
    def queries(request: Request, session: SignedIn) -> Response:
        return queries_page(request, session)

    @router.get("/queries.csv")
    def queries_csv(request: Request, session: SignedIn) -> Response:
        with db_session(request) as s:
            pending = lab_service.lab_queries(
                s, components(request).store, status="pending", limit=EXPORT_LIMIT
            )
        return Response(
            pending_export(pending),
            media_type="text/csv; charset=utf-8",
            headers={"Content-Disposition": 'attachment; filename="pending-queries.csv"'},
        )

    @router.post("/queries/results")
    def post_results(request: Request, form: FormPost, session: SignedIn) -> Response:
        """Measurements in bulk, all or nothing; a refusal shows the page again with the line and why."""
        file = form.get("file")
        try:
            if not isinstance(file, UploadFile) or not file.filename:
                raise ConsoleRefusal(422, "choose the CSV of measurements to upload")
            release_id = integer(form, "release_id", "release id")
            measurements = parse_measurements(file.file.read(), release_id)
            with db_session(request, write=True) as s:
                lines, answered = lab_service.post_measurements(s, components(request).store, measurements)
        except (ConsoleRefusal, ServiceError) as exc:
            status, message = (
                (exc.status, exc.message)
                if isinstance(exc, ConsoleRefusal)
                else (exc.status_code, exc.detail)
            )
            return queries_page(request, session, error=message, status_code=status)
        posted = (
            f"{len(answered)} quer{'y' if len(answered) == 1 else 'ies'} answered from {len(lines)} line(s)"
        )
        return console.redirect_with_flash("/console/queries", session, {"posted": posted})

    @router.post("/queries/{query_id}/result")
    def post_result(request: Request, query_id: RowId, form: FormPost) -> Response:
        value = number(form, "value", "the measured value")
        if value is None:
            raise ConsoleRefusal(422, "the measured value is missing: enter a finite number")
        body = QueryResult(y=value)  # the API's own check (finite)
        with db_session(request, write=True) as s:
            query_service.post_result(s, query_id, body.y)
        return RedirectResponse("/console/queries", status_code=303)

    @router.get("/access-log")
    def access_log(
        request: Request,
        session: SignedIn,
        partner_id: str | None = None,
        after_id: str | None = None,
        limit: Annotated[int, QueryParam(ge=1, le=ACCESS_MAX_LIMIT)] = ACCESS_DEFAULT_LIMIT,
    ) -> HTMLResponse:
        partner = optional_int(partner_id, "partner_id")
        after = optional_int(after_id, "after_id")
        with db_session(request) as s:
            entries = [
                access_entry(e)
                for e in access_service.access_log(s, limit=limit, partner_id=partner, after_id=after)
            ]
        context = {
            "entries": entries,
            "partner_id": partner,
            "after_id": after,
            "limit": limit,
            "next_after": entries[-1].id if len(entries) == limit else None,
            "max_limit": ACCESS_MAX_LIMIT,
        }
        return console.render(request, "access_log.html", context, session=session)
