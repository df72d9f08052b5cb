"""The modeler console's pages (routes -> the same service functions as the API).

* ``/console``: the studies (name, tags, status, progress, best so far), polled while one is active; a
  search form (``?name=&tag=``, a GET: the filtered list has its own URL) narrows them.
* ``/console/studies/new``: the create form, its parameter inputs built from the strategies' JSON schemas.
* ``/console/studies/{id}``: facts, the name and tags (``POST .../labels``), live progress (htmx fragment
  ``.../live`` every 2 s while active, with
  the chart ``.../chart.svg``), Run / Step / Stop, the audit log with verification and exports.

Routes are sync (``def``): FastAPI runs them in its thread pool, like the API's (the GP arithmetic of a step
and the curator calls never run on the event loop). Reads use a read transaction, writes their own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlencode

from fastapi import Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse
from pydantic import ValidationError
from sqlalchemy.orm import Session

from modeler_service import repository as repo
from modeler_service import results, runner, service
from modeler_service.api.deps import Components
from modeler_service.console.forms import (
    FieldSpec,
    FormProblems,
    check_params,
    field_specs,
    fill,
    read_params,
    split_tags,
    study_body,
)
from modeler_service.context import Context
from modeler_service.db import transaction
from modeler_service.kinds import kind_of
from modeler_service.schemas import AuditLog, StrategyInfo, StudyPublic, StudyUpdate
from shared.protocol.schemas.studies import DEFAULT_STRATEGY
from shared.servicekit.console import Console, ConsoleRefusal, FormPost, SignedIn
from shared.servicekit.console.charts import SVG_MEDIA_TYPE, Series, line_chart
from shared.servicekit.exceptions import ServiceError

#: Audit entries shown on the study page (the latest ones; the exports have them all).
AUDIT_ROWS = 1000
#: Rounds shown in the per-round table of a study whose rounds have several requests.
ROUND_ROWS = 30
#: What a redirect after a POST may announce (fixed texts: nothing from the URL is shown).
NOTICES = {
    "created": "Study created.",
    "run": "Run started: the study runs in the background.",
    "step": "One round done.",
    "stop": "Stop asked: the study stops after the round in flight.",
    "labels": "Name and tags saved.",
}


def _components(request: Request) -> Components:
    components: Components = request.app.state.components
    return components


@contextmanager
def _read(request: Request) -> Iterator[Session]:
    with transaction(_components(request).ctx.db, write=False) as session:
        yield session


def _strategies() -> dict[str, StrategyInfo]:
    return {s.name: s for s in service.strategies().strategies}


def _is_active(study: StudyPublic) -> bool:
    return study.status in repo.ACTIVE_STATUSES


def _source(study: StudyPublic) -> str:
    if study.gradient_oracle_id is not None:
        return f"gradient oracle {study.gradient_oracle_id}"
    return f"release {study.release_id}"


def _theta_text(theta: list[float] | None, shown: int = 4) -> str:
    if not theta:
        return "–"
    head = ", ".join(f"{v:.4g}" for v in theta[:shown])
    return f"θ = ({head}{', …' if len(theta) > shown else ''})"


def _best_text(study: StudyPublic) -> str:
    best = study.best
    if best is None:
        return "–"
    if best.y is not None:
        return f"{best.y:.6g}"
    return _theta_text(best.theta)


def _rounds(log: AuditLog) -> list[dict[str, Any]]:
    """Per round: its queries, best and mean y (the values a batch or LDP strategy's round recorded)."""
    rounds: dict[int, list[float]] = {}
    sizes: dict[int, int] = {}
    for e in log.entries:
        sizes[e.round] = sizes.get(e.round, 0) + 1
        if e.y is not None:
            rounds.setdefault(e.round, []).append(e.y)
    out = []
    last = 0
    for round_no in sorted(sizes):
        ys = rounds.get(round_no, [])
        last += sizes[round_no]
        out.append(
            {
                "round": round_no,
                "queries": sizes[round_no],
                "last_seq": last,
                "best": max(ys) if ys else None,
                "mean": sum(ys) / len(ys) if ys else None,
            }
        )
    return out


def _live_context(session: Session, study_id: str, ctx: Context) -> dict[str, Any]:
    study = service.study_detail(session, ctx, study_id)
    log = results.audit_log(session, study_id)
    rounds = _rounds(log)
    batched = any(r["queries"] > 1 for r in rounds)  # batch, MoMA epochs, LDP: show the rounds
    return {
        "study": study,
        "active": _is_active(study),
        "best_text": _best_text(study),
        "theta_best": study.best is not None and study.best.theta is not None,
        "rounds": rounds[-ROUND_ROWS:] if batched else [],
        "rounds_total": len(rounds),
        "audit_count": log.count,
    }


def _facts(study: StudyPublic) -> list[tuple[str, str]]:
    facts = [
        ("Study", study.id),
        ("Name", study.name or "–"),
        ("Tags", ", ".join(study.tags) or "–"),
        ("Strategy", study.strategy),
        ("Curator", study.curator_url),
        ("Runs on", _source(study)),
        ("Budget", f"{study.iterations_total} queries"),
        ("Created", study.created_at.strftime("%Y-%m-%d %H:%M:%S UTC")),
    ]
    if study.release is not None:
        rel = study.release
        facts += [
            ("Rows × columns", f"{rel.n} × {rel.r}"),
            ("Privacy", f"ε = {rel.epsilon:.4g}, δ = {rel.delta:.3g} ({rel.mechanism})"),
            ("Formal guarantee", "yes" if rel.formal_guarantee else "no"),
        ]
        if rel.noise_std is not None:
            facts.append(("Noise std", f"{rel.noise_std:.4g}"))
        if rel.lift is not None:
            facts.append(("Lift", f"{rel.lift} (ω = {rel.omega})"))
        facts.append(("Rows sha256", rel.sha256))
    if study.gradient_oracle is not None:
        go = study.gradient_oracle
        facts += [
            ("Loss", f"{go.loss}, dimension {go.dimension}, n = {go.n}"),
            (
                "Privacy",
                f"μ = {go.mu:.4g}-GDP (ε = {go.epsilon:.4g}, δ = {go.delta:.3g}), clip {go.clip:.4g}",
            ),
            ("Oracle steps", f"{go.steps} ({go.steps_left} left at creation)"),
        ]
    return facts


def _params_rows(params: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [
        (k, v if isinstance(v, str) else json.dumps(v, separators=(", ", ": "))) for k, v in params.items()
    ]


def register(console: Console) -> None:
    router = console.router

    # --------------------------------------------------------------------------------------- studies

    def studies_context(request: Request, name: str | None, tag: str | None) -> dict[str, Any]:
        """The studies, filtered by the search form: a part of the name, tags separated by spaces or
        commas (every one must match). A tag no study can have: no rows, and the message of what a tag is."""
        search = {"name": (name or "").strip()[:200], "tag": " ".join(split_tags(tag))}
        found, problem = [], None
        try:
            with _read(request) as session:
                tags = split_tags(search["tag"])
                found = service.list_studies(session, name=search["name"], tags=tags).data
        except ServiceError as exc:
            problem = exc.detail
        rows = [
            {"study": s, "source": _source(s), "best": _best_text(s), "active": _is_active(s)} for s in found
        ]
        query = urlencode({k: v for k, v in search.items() if v})
        return {
            "rows": rows,
            "any_active": any(r["active"] for r in rows),
            "search": search,
            "searching": bool(query),
            "search_problem": problem,
            "table_url": "/console/studies-table" + (f"?{query}" if query else ""),
        }

    @router.get("")
    def studies(
        request: Request, session: SignedIn, name: str | None = None, tag: str | None = None
    ) -> HTMLResponse:
        context = studies_context(request, name, tag)
        status = 422 if context["search_problem"] else 200
        return console.render(request, "studies.html", context, session=session, status_code=status)

    @router.get("/studies-table")
    def studies_table(
        request: Request, session: SignedIn, name: str | None = None, tag: str | None = None
    ) -> HTMLResponse:
        context = studies_context(request, name, tag)
        return console.render(request, "_studies_table.html", context, session=session)

    # ------------------------------------------------------------------------------------ new study

    def form_page(
        request: Request,
        strategy_name: str | None,
        *,
        form: Mapping[str, Any] | None = None,
        problems: list[tuple[str, str]] | None = None,
        status: int = 200,
    ) -> HTMLResponse:
        strategies = _strategies()
        if strategy_name not in strategies:
            if strategy_name:
                problems = [*(problems or []), ("strategy", f"no strategy named {strategy_name!r}")]
                status = 422 if status == 200 else status
            strategy_name = DEFAULT_STRATEGY if DEFAULT_STRATEGY in strategies else next(iter(strategies))
        info = strategies[strategy_name]
        specs: list[FieldSpec] = field_specs(info)
        values = {
            **{"curator_url": "", "release_id": "", "gradient_oracle_id": "", "iterations": ""},
            **{"name": "", "tags": ""},
        }
        if form is not None:
            fill(specs, form)
            for key in values:  # never the curator token: it is typed again
                raw = form.get(key)
                values[key] = raw if isinstance(raw, str) else ""
        return console.render(
            request,
            "study_new.html",
            {
                "strategies": list(strategies.values()),
                "info": info,
                "specs": specs,
                "values": values,
                "problems": problems or [],
            },
            status_code=status,
        )

    @router.get("/studies/new")
    def new_study(request: Request, session: SignedIn, strategy: str | None = None) -> HTMLResponse:
        return form_page(request, strategy)

    @router.get("/studies/new/params")
    def new_study_params(
        request: Request,
        session: SignedIn,
        strategy: str | None = None,
        release_id: str | None = None,
        gradient_oracle_id: str | None = None,
    ) -> HTMLResponse:
        """The parameter fieldset of one strategy (htmx swaps it in when the strategy changes; the release
        or oracle id typed so far is kept)."""
        strategies = _strategies()
        if strategy not in strategies:
            raise ConsoleRefusal(404, f"no strategy named {strategy!r}")
        info = strategies[strategy]
        values = {
            key: value
            for key, value in (("release_id", release_id), ("gradient_oracle_id", gradient_oracle_id))
            if value is not None and value.isdigit()
        }
        return console.render(
            request,
            "_params.html",
            {"info": info, "specs": field_specs(info), "values": values},
            session=session,
        )

    @router.post("/studies/new")
    def create_study(request: Request, form: FormPost) -> Response:
        chosen = form.get("strategy")
        chosen = chosen if isinstance(chosen, str) else ""
        shown = form.get("params_of")
        if form.get("choose") is not None or (isinstance(shown, str) and shown != chosen):
            # "Choose" (no script needed), or the strategy changed without its inputs: show its inputs
            problems = []
            if form.get("choose") is None:
                problems = [("strategy", f"check the parameters of {chosen!r} below and create again")]
            return form_page(request, chosen, form=form, problems=problems, status=422 if problems else 200)
        strategies = _strategies()
        if chosen not in strategies:
            return form_page(request, chosen, form=form, status=422)
        info = strategies[chosen]
        specs = field_specs(info)
        try:
            params = read_params(specs, form)
            check_params(chosen, params)
            body = study_body(form, info, params)
        except FormProblems as exc:
            return form_page(request, chosen, form=form, problems=exc.messages, status=422)
        ctx = _components(request).ctx
        try:
            with transaction(ctx.db) as session:
                study_id = service.create_study(session, ctx, body).id
        except ServiceError as exc:  # the curator's refusal, a bad grant, ...: the form again, with why
            return form_page(
                request, chosen, form=form, problems=[("study", exc.detail)], status=exc.status_code
            )
        return RedirectResponse(f"/console/studies/{study_id}?notice=created", status_code=303)

    # ------------------------------------------------------------------------------------ one study

    @router.get("/studies/{study_id}")
    def study_page(
        request: Request, study_id: str, session: SignedIn, notice: str | None = None, verify: bool = False
    ) -> HTMLResponse:
        with _read(request) as db:
            live = _live_context(db, study_id, _components(request).ctx)
            log = results.audit_log(db, study_id)
            verification = results.verify_audit(db, study_id) if verify else None
        study: StudyPublic = live["study"]
        entries = log.entries[-AUDIT_ROWS:]
        context = {
            **live,
            "facts": _facts(study),
            "params": _params_rows(study.strategy_params),
            "entries": entries,
            "entries_hidden": log.count - len(entries),
            "verification": verification,
            "notice": NOTICES.get(notice or ""),
            "remaining": study.iterations_total - study.iterations_done,
        }
        return console.render(request, "study.html", context, session=session)

    @router.get("/studies/{study_id}/live")
    def study_live(request: Request, study_id: str, session: SignedIn, watching: bool = False) -> Response:
        """The live fragment. A page that watched an active study reloads once it is not active any more
        (``HX-Refresh``): its buttons and audit table are then current."""
        with _read(request) as db:
            live = _live_context(db, study_id, _components(request).ctx)
        page = console.render(request, "_study_live.html", live, session=session)
        if watching and not live["active"] and request.headers.get("hx-request"):
            page.headers["HX-Refresh"] = "true"
        return page

    @router.get("/studies/{study_id}/chart.svg")
    def study_chart(request: Request, study_id: str, session: SignedIn) -> Response:
        with _read(request) as db:
            study = service.get_study(db, study_id)
            svg = kind_of(study).chart(db, study)
            if svg is None:
                svg = _best_chart(results.audit_log(db, study_id))
        return Response(svg, media_type=SVG_MEDIA_TYPE)

    @router.post("/studies/{study_id}/run")
    def run(request: Request, study_id: str, form: FormPost) -> Response:
        raw = form.get("iterations")
        text = raw.strip() if isinstance(raw, str) else ""
        iterations = None
        if text:
            try:
                iterations = int(text)
            except ValueError:
                raise ConsoleRefusal(422, f"iterations: {text!r} is not a whole number") from None
            if iterations < 1:
                raise ConsoleRefusal(422, "iterations: run at least 1 iteration (or leave it empty for all)")
        components = _components(request)
        runner.start_run(components.ctx, components.runners, study_id, iterations)
        return RedirectResponse(f"/console/studies/{study_id}?notice=run", status_code=303)

    @router.post("/studies/{study_id}/step")
    def step(request: Request, study_id: str, form: FormPost) -> Response:
        components = _components(request)
        runner.step_now(components.ctx, components.stepper, components.runners, study_id)
        return RedirectResponse(f"/console/studies/{study_id}?notice=step", status_code=303)

    @router.post("/studies/{study_id}/labels")
    def labels(request: Request, study_id: str, form: FormPost) -> Response:
        """The study's name and tags (an empty name removes it; the tags replace all), in any status."""
        name = str(form.get("name") or "").strip()
        try:
            body = StudyUpdate.model_validate({"name": name or None, "tags": split_tags(form.get("tags"))})
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ConsoleRefusal(422, f"The name and tags were not saved: {problems}") from None
        service.update_study(_components(request).ctx, study_id, body)
        return RedirectResponse(f"/console/studies/{study_id}?notice=labels", status_code=303)

    @router.post("/studies/{study_id}/stop")
    def stop(request: Request, study_id: str, form: FormPost) -> Response:
        with transaction(_components(request).ctx.db) as db:
            service.stop_run(db, study_id)
        return RedirectResponse(f"/console/studies/{study_id}?notice=stop", status_code=303)

    # ----------------------------------------------------------------------------------------- audit

    @router.get("/studies/{study_id}/verify")
    def audit_verify(request: Request, study_id: str, session: SignedIn) -> HTMLResponse:
        """The verification fragment (htmx); without scripts the link opens the page with ``?verify=1``."""
        with _read(request) as db:
            verification = results.verify_audit(db, study_id)
        return console.render(request, "_audit_verify.html", {"verification": verification}, session=session)

    @router.get("/studies/{study_id}/audit.csv")
    def audit_csv(request: Request, study_id: str, session: SignedIn) -> Response:
        with _read(request) as db:
            text = results.audit_csv(db, study_id)
        return Response(
            text,
            media_type="text/csv",
            headers={"Content-Disposition": f'attachment; filename="audit-{study_id}.csv"'},
        )

    @router.get("/studies/{study_id}/audit.json")
    def audit_json(request: Request, study_id: str, session: SignedIn) -> Response:
        with _read(request) as db:
            log = results.audit_log(db, study_id)
        return Response(
            log.model_dump_json(),
            media_type="application/json",
            headers={"Content-Disposition": f'attachment; filename="audit-{study_id}.json"'},
        )


# ------------------------------------------------------------------------------------------------ charts


def _best_chart(log: AuditLog) -> bytes:
    """Best value so far per query (step), every observed y (dots), and each round's mean when rounds
    have several queries (batch, MoMA epochs)."""
    xs: list[float] = []
    ys: list[float] = []
    best: list[float] = []
    for e in log.entries:
        if e.y is None:
            continue
        xs.append(float(e.seq))
        ys.append(e.y)
        best.append(e.y if not best else max(best[-1], e.y))
    series = [Series("best so far", xs, best, step=True), Series("observed y", xs, ys, markers=True)]
    rounds = _rounds(log)
    if any(r["queries"] > 1 for r in rounds):
        pts = [(float(r["last_seq"]), float(r["mean"])) for r in rounds if r["mean"] is not None]
        series.append(Series("round mean y", [p[0] for p in pts], [p[1] for p in pts], markers=True))
    return line_chart(series, title="Best value so far", xlabel="query", ylabel="y", empty="no answers yet")
