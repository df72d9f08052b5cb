"""Releases: the list (parameters, sha256, which partners hold each), one release with its query log, and
the verification of the query log's hash chain."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from curator_service.console.common import ADMIN, RowId, db_session
from curator_service.schemas import release_detail
from curator_service.services import partners as partner_service
from curator_service.services import queries as query_service
from curator_service.services import releases as release_service
from shared.servicekit.console import Console, SignedIn


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
