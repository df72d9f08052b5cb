"""Partners: the list (status, quota, grants), the creation form (its answer shows the token once), revoke,
grants of releases and gradient oracles, and one partner's page: its tokens (a new one, revoking one, each
irreversible step behind a confirmation page) and the change of its quota or output privacy."""

from __future__ import annotations

from typing import Any

from fastapi import Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse

from curator_service.console.common import (
    ADMIN,
    RowId,
    checked,
    db_session,
    ids,
    integer,
    number,
    text,
    validated,
)
from curator_service.schemas import partner_public, release_detail
from curator_service.services import gradients as gradient_service
from curator_service.services import partners as partner_service
from curator_service.services import releases as release_service
from shared.protocol.schemas import GrantCreate, PartnerCreate, PartnerUpdate
from shared.servicekit.console import Console, ConsoleRefusal, FormPost, SignedIn


def _output_privacy(form: Any) -> dict[str, Any] | None:
    """The ``output_privacy`` object of ``POST /v1/partners`` from the form's fieldset (None: not asked)."""
    if not checked(form, "output_privacy"):
        return None
    data: dict[str, Any] = {
        "epsilon": number(form, "op_epsilon", "output epsilon"),
        "B": number(form, "op_B", "B"),
        "R": number(form, "op_R", "R"),
        "fresh_repeats": checked(form, "op_fresh_repeats"),
        "store_raw": checked(form, "op_store_raw"),
    }
    cap = number(form, "op_max_epsilon_per_row", "max epsilon per row")
    if cap is not None:
        data["max_epsilon_per_row"] = cap
    return data


#: What a redirect to a partner's page may announce (fixed texts: nothing from the URL is shown).
NOTICES = {
    "changed": "Partner changed.",
    "token-revoked": "Token revoked: it answers 401 from now on.",
}


def register(console: Console) -> None:
    router = console.router

    @router.get("/partners")
    def partners(request: Request, session: SignedIn) -> HTMLResponse:
        with db_session(request) as s:
            rows, grants, oracle_grants = partner_service.list_partners(s)
            data = [partner_public(p, (grants.get(p.id, []), oracle_grants.get(p.id, []))) for p in rows]
            releases = [release_detail(r) for r in release_service.list_releases(s, ADMIN)]
            oracles = [gradient_service.oracle_public(o) for o in gradient_service.list_oracles(s, ADMIN)]
        context = {"partners": data, "releases": releases, "oracles": oracles}
        return console.render(request, "partners.html", context, session=session)

    @router.post("/partners")
    def create_partner(request: Request, form: FormPost, session: SignedIn) -> Response:
        data: dict[str, Any] = {
            "name": text(form, "name") or "",
            "max_queries": integer(form, "max_queries", "max queries"),
            "release_ids": ids(form, "release_ids"),
            "gradient_oracle_ids": ids(form, "gradient_oracle_ids"),
        }
        output = _output_privacy(form)
        if output is not None:
            data["output_privacy"] = output
        body = validated(PartnerCreate, data)
        with db_session(request, write=True) as s:
            partner, token = partner_service.create_partner(
                s,
                name=body.name,
                release_ids=body.release_ids,
                max_queries=body.max_queries,
                output_privacy=body.output_privacy,
                gradient_oracle_ids=body.gradient_oracle_ids,
            )
            s.flush()
            partner_id = partner.id
        # committed: the token is shown by the page this redirects to, once (the database keeps its hash);
        # a reload of that page creates nothing and shows no token
        flash = {"partner_id": partner_id, "token": token, "what": "created"}
        return console.redirect_with_flash(f"/console/partners/{partner_id}/token", session, flash)

    @router.post("/partners/{partner_id}/tokens")
    def new_token(request: Request, partner_id: RowId, form: FormPost, session: SignedIn) -> Response:
        with db_session(request, write=True) as s:
            _, token = partner_service.add_token(s, partner_id)
        flash = {"partner_id": partner_id, "token": token, "what": "token"}
        return console.redirect_with_flash(f"/console/partners/{partner_id}/token", session, flash)

    @router.get("/partners/{partner_id}/token")
    def shown_once(request: Request, partner_id: RowId, session: SignedIn) -> Response:
        """The partner and, right after its creation or a new token, the token (once)."""
        with db_session(request) as s:
            partner = partner_service.get_partner(s, partner_id)
            shown = partner_public(partner, partner_service.granted(s, partner.id))
        flash = console.flash(request, session)
        context: dict[str, Any] = {"partner": shown}
        if flash is not None and flash.get("partner_id") == partner_id:
            context.update(token=flash["token"], what=flash.get("what", "created"))
        return console.forget_flash(console.render(request, "partner_created.html", context, session=session))

    @router.get("/partners/{partner_id}/revoke")
    def confirm_revoke(request: Request, partner_id: RowId, session: SignedIn) -> HTMLResponse:
        """Revoking cannot be undone: this page asks first; its button posts the revocation."""
        with db_session(request) as s:
            partner = partner_service.get_partner(s, partner_id)
            shown = partner_public(partner, partner_service.granted(s, partner.id))
        return console.render(request, "partner_revoke.html", {"partner": shown}, session=session)

    @router.post("/partners/{partner_id}/revoke")
    def revoke(request: Request, partner_id: RowId, form: FormPost) -> Response:
        if text(form, "confirm") != "yes":  # not from the confirmation page: ask first
            return RedirectResponse(f"/console/partners/{partner_id}/revoke", status_code=303)
        with db_session(request, write=True) as s:
            partner_service.revoke(s, partner_id)
        return RedirectResponse("/console/partners", status_code=303)

    @router.post("/partners/grants")
    def grant(request: Request, form: FormPost) -> Response:
        partner_id = integer(form, "partner_id", "partner")
        if partner_id is None:
            raise ConsoleRefusal(422, "choose the partner to grant to")
        body = validated(
            GrantCreate,
            {
                "release_ids": ids(form, "release_ids"),
                "gradient_oracle_ids": ids(form, "gradient_oracle_ids"),
            },
        )
        with db_session(request, write=True) as s:
            partner_service.grant(s, partner_id, body.release_ids, body.gradient_oracle_ids)
        return RedirectResponse("/console/partners", status_code=303)

    # one partner (after the fixed paths above: /partners/grants is not a partner id)

    @router.get("/partners/{partner_id}")
    def partner_page(
        request: Request, partner_id: RowId, session: SignedIn, notice: str | None = None
    ) -> HTMLResponse:
        """The partner, its tokens (ids and dates, never a token) and the form that changes it."""
        with db_session(request) as s:
            partner = partner_service.get_partner(s, partner_id)
            shown = partner_public(partner, partner_service.granted(s, partner.id))
            tokens = [
                {"id": t.id, "created_at": t.created_at, "revoked": t.revoked_at is not None}
                for t in partner_service.list_tokens(s, partner_id)
            ]
        context = {"partner": shown, "tokens": tokens, "notice": NOTICES.get(notice or "")}
        return console.render(request, "partner.html", context, session=session)

    @router.post("/partners/{partner_id}")
    def change_partner(request: Request, partner_id: RowId, form: FormPost) -> Response:
        """``PATCH /v1/partners/{id}``: the quota and/or the output privacy (a charge to a population's budget
        only with the form's confirmation box ticked)."""
        data: dict[str, Any] = {}
        quota = integer(form, "max_queries", "max queries")
        if quota is not None:
            data["max_queries"] = quota
        output = _output_privacy(form)
        if output is not None:
            data["output_privacy"] = output
        body = validated(PartnerUpdate, data)
        changes: dict[str, Any] = {"max_queries": body.max_queries}
        if "output_privacy" in body.model_fields_set:
            changes["output_privacy"] = body.output_privacy
        with db_session(request, write=True) as s:
            partner_service.update(
                s, partner_id, **changes, charge_confirmed=checked(form, "op_accept_charge")
            )
        return RedirectResponse(f"/console/partners/{partner_id}?notice=changed", status_code=303)

    @router.get("/partners/{partner_id}/tokens/{token_id}/revoke")
    def confirm_token_revoke(
        request: Request, partner_id: RowId, token_id: RowId, session: SignedIn
    ) -> HTMLResponse:
        """Revoking a token cannot be undone: this page asks first; its button posts the revocation."""
        with db_session(request) as s:
            partner = partner_service.get_partner(s, partner_id)
            shown = partner_public(partner, partner_service.granted(s, partner.id))
            tokens = partner_service.list_tokens(s, partner_id)
        token = next((t for t in tokens if t.id == token_id), None)
        if token is None:
            raise ConsoleRefusal(404, f"partner {partner_id} has no token {token_id}")
        live = [t.id for t in tokens if t.revoked_at is None]
        context = {
            "partner": shown,
            "token": {
                "id": token.id,
                "created_at": token.created_at,
                "revoked": token.revoked_at is not None,
            },
            "last": live == [token_id],  # revoking it leaves the partner without a working token
        }
        return console.render(request, "token_revoke.html", context, session=session)

    @router.post("/partners/{partner_id}/tokens/{token_id}/revoke")
    def revoke_token(request: Request, partner_id: RowId, token_id: RowId, form: FormPost) -> Response:
        if text(form, "confirm") != "yes":  # not from the confirmation page: ask first
            return RedirectResponse(
                f"/console/partners/{partner_id}/tokens/{token_id}/revoke", status_code=303
            )
        with db_session(request, write=True) as s:
            partner_service.revoke_token(s, partner_id, token_id)
        return RedirectResponse(f"/console/partners/{partner_id}?notice=token-revoked", status_code=303)
