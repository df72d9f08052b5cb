"""Datasets: the list and the CSV upload, one dataset's page (what it protects, the privacy report, its
budget), its budget charts, the form that makes a release of it (its confirmation page and the POST
that makes the release are ``pages_releases``'), and its erasure (a confirmation page first; an erased
dataset's page is its tombstone)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse

from curator_service.console import upload_form
from curator_service.console.common import (
    ADMIN,
    RowId,
    components,
    db_session,
    text,
)
from curator_service.services import datasets as dataset_service
from curator_service.services import erasure as erasure_service
from curator_service.services import gradients as gradient_service
from curator_service.services import populations as population_service
from curator_service.services import privacy as privacy_service
from curator_service.services import releases as release_service
from shared.protocol.schemas import DELTA_MIN, EPSILON_MAX, EPSILON_MIN, LedgerPublic
from shared.servicekit.console import Console, FormPost, SignedIn
from shared.servicekit.console.auth import ConsoleSession
from shared.servicekit.console.charts import SVG_MEDIA_TYPE, Bar, budget_chart

#: The privacy report's defaults on the dataset page (the form above the report changes them).
DEFAULT_EPSILON = 1.0
DEFAULT_R_MAX = 30


def default_delta(n: int) -> float:
    """1e-5, or smaller for a dataset of more than 10^4 rows (delta must stay well below 1/n)."""
    return min(1e-5, 0.1 / max(n, 1))


def budget_bars(ledger: LedgerPublic) -> list[Bar]:
    """Spent and left of the population's budget, as shares of it: epsilon of the releases, of the gradient
    oracles and of raised output allotments (when the ledger has some), all of epsilon, and delta."""
    eps_total = ledger.epsilon_budget or 1.0
    delta_total = ledger.delta_budget or 1.0
    releases = sum(
        e.epsilon
        for e in ledger.entries
        if e.gradient_oracle_id is None and e.mechanism != "output-allotment"  # a reserved release: no id yet
    )
    bars = [Bar(f"epsilon, releases ({releases:.3g} of {eps_total:.3g})", releases / eps_total, 1.0)]
    for label, part in (
        ("gradient oracles", [e for e in ledger.entries if e.gradient_oracle_id is not None]),
        ("raised output allotments", [e for e in ledger.entries if e.mechanism == "output-allotment"]),
    ):
        if part:
            spent = sum(e.epsilon for e in part)
            bars.append(Bar(f"epsilon, {label} ({spent:.3g})", spent / eps_total, 1.0))
    bars.append(
        Bar(
            f"epsilon, all ({ledger.epsilon_spent:.3g} of {eps_total:.3g})",
            ledger.epsilon_spent / eps_total,
            1.0,
        )
    )
    bars.append(
        Bar(f"delta ({ledger.delta_spent:.3g} of {delta_total:.3g})", ledger.delta_spent / delta_total, 1.0)
    )
    return bars


def register(console: Console) -> None:
    router = console.router

    def datasets_page(
        request: Request,
        session: ConsoleSession,
        *,
        entered: dict[str, Any] | None = None,
        error: str | None = None,
        status_code: int = 200,
    ) -> HTMLResponse:
        with db_session(request) as s:
            data = dataset_service.views(s, dataset_service.list_datasets(s))
        context = {
            "datasets": data,
            "max_upload_bytes": components(request).settings.max_upload_bytes,
            "form": entered or {},
            "error": error,
        }
        return console.render(request, "datasets.html", context, session=session, status_code=status_code)

    @router.get("/datasets")
    def datasets(request: Request, session: SignedIn) -> HTMLResponse:
        return datasets_page(request, session)

    @router.post("/datasets")
    def upload(request: Request, form: FormPost, session: SignedIn) -> Response:
        """Post/redirect/get on success; a refusal shows the page again, with the values entered."""
        c = components(request)
        try:
            upload, file = upload_form.upload_of(form)
            with db_session(request, write=True) as s:
                dataset = dataset_service.create_dataset(
                    s,
                    c.store,
                    upload,
                    file.file,
                    size=file.size,
                    max_upload_bytes=c.settings.max_upload_bytes,
                    max_features=c.settings.max_features,
                    parse_workers=c.settings.csv_parse_workers,
                )
                s.flush()
                dataset_id = dataset.id
        except Exception as exc:  # a refusal: the page again, with the values entered and why
            refused = upload_form.refusal(console, exc)
            if refused is None:
                raise
            status, message = refused
            entered = upload_form.entered(form)
            return datasets_page(request, session, entered=entered, error=message, status_code=status)
        return RedirectResponse(f"/console/datasets/{dataset_id}", status_code=303)

    @router.get("/datasets/{dataset_id}")
    def dataset(
        request: Request,
        dataset_id: RowId,
        session: SignedIn,
        epsilon: Annotated[float | None, Query(ge=EPSILON_MIN, le=EPSILON_MAX)] = None,
        delta: Annotated[float | None, Query(ge=DELTA_MIN, lt=1)] = None,
        r_max: Annotated[int, Query(ge=1, le=10_000)] = DEFAULT_R_MAX,
    ) -> HTMLResponse:
        c = components(request)
        with db_session(request) as s:
            view = dataset_service.view(s, dataset_service.get_dataset(s, dataset_id))
            ledger = population_service.ledger_public(s, view.population_id)
            releases = release_service.list_releases(s, ADMIN, dataset_id)
            oracles = [
                gradient_service.oracle_public(o) for o in gradient_service.list_oracles(s, ADMIN, dataset_id)
            ]
            if view.erased_at is not None:  # a tombstone: no data left to report on
                tomb = {"dataset": view, "ledger": ledger, "releases": releases, "oracles": oracles}
                return console.render(request, "dataset_erased.html", tomb, session=session)
            eps = epsilon if epsilon is not None else DEFAULT_EPSILON
            dlt = delta if delta is not None else default_delta(view.n)
            report = privacy_service.privacy_report(
                s, c.db, c.store, dataset_id, epsilon=eps, delta=dlt, r_max=r_max
            )
        context: dict[str, Any] = {
            "dataset": view,
            "ledger": ledger,
            "output": ledger.output,
            "releases": releases,
            "oracles": oracles,
            "report": report,
            "r_max": r_max,
        }
        return console.render(request, "dataset.html", context, session=session)

    @router.get("/datasets/{dataset_id}/erase")
    def confirm_erase(request: Request, dataset_id: RowId, session: SignedIn) -> HTMLResponse:
        """Erasing cannot be undone: this page says what goes and who still holds the dataset; its button
        posts the erasure."""
        with db_session(request) as s:
            view = dataset_service.view(s, dataset_service.get_dataset(s, dataset_id))
            holders = erasure_service.live_holders(s, dataset_id)
        context = {"dataset": view, "holders": holders}
        return console.render(request, "dataset_erase.html", context, session=session)

    @router.post("/datasets/{dataset_id}/erase")
    def erase(request: Request, dataset_id: RowId, form: FormPost) -> Response:
        """Post/redirect/get: only the confirmation page's button erases; a 409 (a live grant, without
        ``force``) is shown as the console's error page."""
        if text(form, "confirm") != "yes":  # not from the confirmation page: ask first
            return RedirectResponse(f"/console/datasets/{dataset_id}/erase", status_code=303)
        c = components(request)
        erasure_service.erase_dataset(c.db, c.store, dataset_id, force=text(form, "force") == "true")
        return RedirectResponse(f"/console/datasets/{dataset_id}", status_code=303)

    @router.get("/datasets/{dataset_id}/budget.svg")
    def dataset_budget(request: Request, dataset_id: RowId, session: SignedIn) -> Response:
        with db_session(request) as s:
            view = dataset_service.view(s, dataset_service.get_dataset(s, dataset_id))
            ledger = population_service.ledger_public(s, view.population_id)
        svg = budget_chart(
            budget_bars(ledger),
            title=f"budget of population #{view.population_id}: spent and left",
            unit="share of the population's budget",
        )
        return Response(svg, media_type=SVG_MEDIA_TYPE)

    @router.get("/datasets/{dataset_id}/output.svg")
    def dataset_output(request: Request, dataset_id: RowId, session: SignedIn) -> Response:
        with db_session(request) as s:
            view = dataset_service.view(s, dataset_service.get_dataset(s, dataset_id))
            ledger = population_service.ledger_public(s, view.population_id)
        bars: list[Bar] = []
        out = ledger.output
        if out is not None:
            if out.largest_person_total is not None:
                bars.append(Bar("largest person (bound)", out.largest_person_total, 0.0))
            if out.largest_row_total is not None:
                bars.append(Bar("largest row", out.largest_row_total, 0.0))
        svg = budget_chart(bars, title="output epsilon spent on outcomes (no budget: a running total)")
        return Response(svg, media_type=SVG_MEDIA_TYPE)
