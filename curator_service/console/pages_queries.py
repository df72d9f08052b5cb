"""Queries waiting for a measured outcome (``manual`` datasets) with a form each, and the access log."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from fastapi import Query as QueryParam
from fastapi import Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from curator_service.console.common import RowId, db_session, number, optional_int
from curator_service.models import Dataset, Partner, Query, Release
from curator_service.schemas import access_entry
from curator_service.services import access_log as access_service
from curator_service.services import queries as query_service
from shared.protocol.schemas import QueryResult
from shared.servicekit.console import Console, ConsoleRefusal, FormPost, SignedIn

#: At most this many pending queries on the page (oldest first), and access-log entries per page.
PENDING_LIMIT = 500
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


def register(console: Console) -> None:
    router = console.router

    @router.get("/queries")
    def queries(request: Request, session: SignedIn) -> HTMLResponse:
        with db_session(request) as s:
            pending = pending_manual_queries(s)
        return console.render(
            request, "queries.html", {"pending": pending, "limit": PENDING_LIMIT}, session=session
        )

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
