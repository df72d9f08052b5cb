"""Releases: the list (parameters, sha256, which partners hold each), one release with its query log, the
verification of the query log's hash chain, and the making of a release: the dataset page's form opens a
confirmation page (what the release will cost the population, what is left), whose button makes it (it
spends budget for good)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from fastapi import Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from sqlalchemy.orm import Session

from curator_service.console.common import (
    ADMIN,
    RowId,
    components,
    db_session,
    integer,
    number,
    text,
    validated,
)
from curator_service.schemas import release_detail
from curator_service.services import datasets as dataset_service
from curator_service.services import partners as partner_service
from curator_service.services import populations as population_service
from curator_service.services import queries as query_service
from curator_service.services import releases as release_service
from shared.protocol.schemas import ReleaseCreate
from shared.servicekit.console import Console, FormPost, SignedIn

#: The fields of the release form (``POST /v1/datasets/{id}/releases``'s), carried from the form through
#: the confirmation page to the POST that makes the release.
RELEASE_FIELDS = (
    "epsilon",
    "delta",
    "r",
    "mechanism",
    "lift",
    "acknowledge_no_guarantee",
    "allow_large_delta",
)


def release_body(fields: Any) -> ReleaseCreate:
    """The form's fields (a POST form or the confirmation page's query) as the API's ``ReleaseCreate``;
    a bad value is a 422 page naming the field."""
    data: dict[str, Any] = {
        "epsilon": number(fields, "epsilon", default=None),
        "delta": number(fields, "delta", default=None),
        "mechanism": text(fields, "mechanism") or "gaussian",
        "acknowledge_no_guarantee": fields.get("acknowledge_no_guarantee") is not None,
        "allow_large_delta": fields.get("allow_large_delta") is not None,
    }
    r = integer(fields, "r")
    if r is not None:
        data["r"] = r
    lift = text(fields, "lift")
    if lift is not None:
        data["lift"] = lift
    return validated(ReleaseCreate, data)


def carried(fields: Mapping[str, Any], names: tuple[str, ...]) -> list[tuple[str, str]]:
    """The non-blank text fields among ``names`` (hidden inputs of a confirmation, or its URL's query)."""
    return [(k, v.strip()) for k in names if isinstance(v := fields.get(k), str) and v.strip()]


def holders(session: Session) -> dict[int, list[tuple[int, str, bool]]]:
    """release id -> the partners granted it: (id, name, revoked)."""
    partners, grants, _ = partner_service.list_partners(session)
    by_id = {p.id: p for p in partners}
    out: dict[int, list[tuple[int, str, bool]]] = {}
    for partner_id, release_ids in grants.items():
        p = by_id.get(partner_id)
        if p is None:
            continue
        for release_id in release_ids:
            out.setdefault(release_id, []).append((p.id, p.name, p.revoked_at is not None))
    return out


def register(console: Console) -> None:
    router = console.router

    @router.get("/releases")
    def releases(request: Request, session: SignedIn) -> HTMLResponse:
        with db_session(request) as s:
            data = [release_detail(r) for r in release_service.list_releases(s, ADMIN)]
            held = holders(s)
        return console.render(request, "releases.html", {"releases": data, "holders": held}, session=session)

    def release_page(request: Request, release_id: int, session: Any, *, verify: bool) -> HTMLResponse:
        verification = None
        with db_session(request) as s:
            release = release_detail(release_service.get_release(s, ADMIN, release_id))
            queries = query_service.list_queries(s, ADMIN, release_id)
            held = holders(s).get(release_id, [])
            if verify:
                result, head = query_service.verify_queries(s, ADMIN, release_id)
                verification = {
                    "ok": result.ok,
                    "entries": result.entries,
                    "first_bad_seq": result.first_bad_seq,
                    "head": head,
                }
        context = {"release": release, "queries": queries, "holders": held, "verification": verification}
        return console.render(request, "release.html", context, session=session)

    @router.get("/releases/{release_id}")
    def release(request: Request, release_id: RowId, session: SignedIn) -> HTMLResponse:
        return release_page(request, release_id, session, verify=False)

    @router.get("/releases/{release_id}/verify")
    def verify(request: Request, release_id: RowId, session: SignedIn) -> HTMLResponse:
        """Verifying changes nothing: a GET link, the release page with the result on top."""
        return release_page(request, release_id, session, verify=True)

    @router.get("/datasets/{dataset_id}/releases/new")
    def confirm_release(request: Request, dataset_id: RowId, session: SignedIn) -> HTMLResponse:
        """What the release asked for will cost and leave (checked as the release itself checks it; nothing
        is reserved); its button makes the release. A GET: a reload asks nothing of the ledger."""
        fields = request.query_params
        body = release_body(fields)
        c = components(request)
        with db_session(request) as s:
            dataset = dataset_service.get_dataset(s, dataset_id)
            charged, formal = release_service.planned_charge(dataset, body, c.settings.max_release_bytes)
            view = dataset_service.view(s, dataset)
            budget = population_service.public(s, view.population_id)
        context = {
            "dataset": view,
            "release": body,
            "charged": charged,
            "formal": formal,
            "budget": budget,
            "epsilon_after": budget.epsilon_spent + charged,
            "delta_after": budget.delta_spent + body.delta,
            "fits": release_service.fits(budget.epsilon_spent, charged, budget.epsilon_budget)
            and release_service.fits(budget.delta_spent, body.delta, budget.delta_budget),
            "fields": carried(fields, RELEASE_FIELDS),
        }
        return console.render(request, "release_confirm.html", context, session=session)

    @router.post("/datasets/{dataset_id}/releases")
    def make_release(request: Request, dataset_id: RowId, form: FormPost) -> Response:
        """Make the release (spends budget for good): only from the confirmation page's button; a post of
        the form itself is sent to the confirmation page first."""
        if text(form, "confirm") != "yes":
            query = urlencode(carried(form, RELEASE_FIELDS))
            return RedirectResponse(f"/console/datasets/{dataset_id}/releases/new?{query}", status_code=303)
        body = release_body(form)
        c = components(request)
        release = release_service.create_release(
            c.db,
            c.store,
            dataset_id,
            body,
            max_bytes=c.settings.max_release_bytes,
            backend=c.compute_backend,
        )
        return RedirectResponse(f"/console/releases/{release.id}", status_code=303)
