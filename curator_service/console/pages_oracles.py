"""Gradient oracles (DP-GIBO) of one dataset: the list (steps used and left, mu spent, who holds each) and
the form that creates one, with the fields of ``POST /v1/datasets/{id}/gradient-oracles``.

Creating an oracle charges its whole mu-GDP cost to the population at once, for good: the form opens a
confirmation page (a GET: the cost in epsilon, the noise, the budget before and after; nothing is written),
whose button posts the creation and redirects to the list (post/redirect/get). A refusal (a bad value, a
loss that does not fit the dataset, the budget) shows the form again with the values entered and why.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlencode

from fastapi import Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse

from curator_service.console.common import (
    ADMIN,
    Fields,
    RowId,
    components,
    db_session,
    integer,
    number,
    text,
    validated,
)
from curator_service.console.pages_releases import carried
from curator_service.services import datasets as dataset_service
from curator_service.services import gradients as gradient_service
from curator_service.services import partners as partner_service
from curator_service.services import populations as population_service
from curator_service.services import releases as release_service
from shared.bo.gibo.oracle import BUILTIN_LOSSES, loss_dimension
from shared.errors import InputDataError
from shared.protocol.schemas import GradientOracleCreate
from shared.protocol.schemas.gradients import MAX_DIMENSION
from shared.servicekit.console import Console, ConsoleRefusal, FormPost, SignedIn
from shared.servicekit.console.auth import ConsoleSession
from shared.servicekit.exceptions import ServiceError

#: The form's fields, carried from the form through the confirmation page to the POST that creates.
ORACLE_FIELDS = (
    "loss",
    "dimension",
    "intercept",
    "bounds",
    "clip",
    "mu",
    "steps",
    "delta",
    "delta_huber",
    "weight_clip",
)
#: The form's values before anything is entered (delta: ``default_delta``).
DEFAULTS = {"loss": "gaussian-location", "bounds": "-5, 5", "clip": "1", "mu": "1", "steps": "30"}
_PAIR = re.compile(r"[,;\s]+")


def default_delta(n: int) -> float:
    """1e-5, or smaller for more than 10^4 rows (an oracle's delta must stay below 1/n)."""
    return min(1e-5, 0.1 / max(n, 1))


def parse_bounds(raw: str | None, dimension: int) -> list[list[float]]:
    """``lo, hi`` per line, one line per coordinate (a single line: the same box side for every coordinate),
    or the API's JSON ``[[lo, hi], ...]``."""
    if raw is None:
        raise ConsoleRefusal(422, "bounds: give one line 'lo, hi' (every coordinate) or one per coordinate")
    if raw.lstrip().startswith("["):
        try:
            pairs = json.loads(raw)
        except ValueError:
            raise ConsoleRefusal(422, "bounds: not valid JSON (expected [[lo, hi], ...])") from None
        if not isinstance(pairs, list) or not all(isinstance(p, list) for p in pairs):
            raise ConsoleRefusal(422, "bounds: expected [[lo, hi], ...]")
    else:
        pairs = []
        for k, line in enumerate(ln for ln in raw.splitlines() if ln.strip()):
            parts = [p for p in _PAIR.split(line.strip()) if p]
            try:
                pair = [float(p) for p in parts]
            except ValueError:
                raise ConsoleRefusal(422, f"bounds, line {k + 1}: {line.strip()!r} is not 'lo, hi'") from None
            if len(pair) != 2:
                raise ConsoleRefusal(422, f"bounds, line {k + 1}: {line.strip()!r} is not 'lo, hi'")
            pairs.append(pair)
    if len(pairs) == 1 and dimension > 1:
        pairs = pairs * dimension
    return pairs


def bounds_text(bounds: list[list[float]]) -> str:
    """The box as the confirmation page shows it: one side for every coordinate when they are all equal."""
    if all(b == bounds[0] for b in bounds):
        return f"[{bounds[0][0]:g}, {bounds[0][1]:g}] for each of the {len(bounds)} coordinates"
    return ", ".join(f"[{lo:g}, {hi:g}]" for lo, hi in bounds)


def oracle_body(fields: Fields, d: int) -> GradientOracleCreate:
    """The form's fields as the API's ``GradientOracleCreate`` (the dimension, when blank, is the built-in
    loss's over the dataset's ``d`` features); a bad value is a ``ConsoleRefusal`` naming the field."""
    loss = text(fields, "loss") or ""
    intercept = fields.get("intercept") is not None
    dimension = integer(fields, "dimension", "dimension")
    if dimension is None:
        if loss not in BUILTIN_LOSSES:
            raise ConsoleRefusal(422, f"dimension: give the dimension of theta for the loss {loss!r}")
        try:
            dimension = loss_dimension(loss, d, intercept=intercept)
        except InputDataError as exc:
            raise ConsoleRefusal(422, str(exc)) from None
    if not 1 <= dimension <= MAX_DIMENSION:
        raise ConsoleRefusal(422, f"dimension must be between 1 and {MAX_DIMENSION}, got {dimension}")
    data: dict[str, Any] = {
        "loss": loss,
        "dimension": dimension,
        "intercept": intercept,
        "bounds": parse_bounds(text(fields, "bounds"), dimension),
        "clip": number(fields, "clip", "clip"),
        "mu": number(fields, "mu", "mu"),
        "steps": integer(fields, "steps", "steps"),
        "delta": number(fields, "delta", "delta"),
    }
    for name in ("delta_huber", "weight_clip"):
        value = number(fields, name, name)
        if value is not None:
            data[name] = value
    return validated(GradientOracleCreate, data)


def register(console: Console) -> None:
    router = console.router

    def oracles_page(
        request: Request,
        session: ConsoleSession,
        dataset_id: int,
        *,
        fields: Fields | None = None,
        problem: str | None = None,
        status: int = 200,
        created: int | None = None,
    ) -> HTMLResponse:
        c = components(request)
        with db_session(request) as s:
            dataset = dataset_service.view(s, dataset_service.get_dataset(s, dataset_id))
            budget = population_service.public(s, dataset.population_id)
            oracles = [
                gradient_service.oracle_public(o) for o in gradient_service.list_oracles(s, ADMIN, dataset_id)
            ]
            partners, _, oracle_grants = partner_service.list_partners(s)
        holders = {
            oracle_id: [(p.id, p.name) for p in partners if oracle_id in oracle_grants.get(p.id, [])]
            for oracle_id in (o.id for o in oracles)
        }
        values: dict[str, Any] = {**DEFAULTS, "delta": f"{default_delta(dataset.n):g}"}
        if fields is not None:  # the values entered, kept on a refusal
            values = dict(carried(fields, ORACLE_FIELDS))
        context = {
            "dataset": dataset,
            "budget": budget,
            "oracles": oracles,
            "holders": holders,
            "losses": [*BUILTIN_LOSSES, *sorted(c.settings.gradient_losses)],
            "values": values,
            "problem": problem,
            "created": created if any(o.id == created for o in oracles) else None,
        }
        return console.render(request, "oracles.html", context, session=session, status_code=status)

    @router.get("/datasets/{dataset_id}/gradient-oracles")
    def oracles(
        request: Request, dataset_id: RowId, session: SignedIn, created: int | None = None
    ) -> HTMLResponse:
        """The list and the form (filled with the values in the query, when the confirmation page's "back"
        link brings them)."""
        entered = request.query_params if "loss" in request.query_params else None
        return oracles_page(request, session, dataset_id, fields=entered, created=created)

    @router.get("/datasets/{dataset_id}/gradient-oracles/new")
    def confirm_oracle(request: Request, dataset_id: RowId, session: SignedIn) -> HTMLResponse:
        """What the oracle asked for will cost (checked as its creation checks it; nothing is written); its
        button creates it. A refusal is the form again, with the values entered."""
        fields = request.query_params
        c = components(request)
        try:
            with db_session(request) as s:
                d = dataset_service.get_dataset(s, dataset_id).d
            body = oracle_body(fields, d)
            charged, noise, _ = gradient_service.planned_charge(
                c.db, c.store, dataset_id, body, c.settings.gradient_losses
            )
        except (ConsoleRefusal, ServiceError, InputDataError) as exc:
            return refused(request, session, dataset_id, fields, exc)
        with db_session(request) as s:
            dataset = dataset_service.view(s, dataset_service.get_dataset(s, dataset_id))
            budget = population_service.public(s, dataset.population_id)
        context = {
            "dataset": dataset,
            "oracle": body,
            "charged": charged,
            "noise_std": noise,
            "budget": budget,
            "epsilon_after": budget.epsilon_spent + charged,
            "delta_after": budget.delta_spent + body.delta,
            "fits": release_service.fits(budget.epsilon_spent, charged, budget.epsilon_budget)
            and release_service.fits(budget.delta_spent, body.delta, budget.delta_budget),
            "fields": carried(fields, ORACLE_FIELDS),
            "bounds_text": bounds_text(body.bounds),
        }
        return console.render(request, "oracle_confirm.html", context, session=session)

    @router.post("/datasets/{dataset_id}/gradient-oracles")
    def create_oracle(request: Request, dataset_id: RowId, form: FormPost, session: SignedIn) -> Response:
        """Create the oracle (spends its whole cost for good): only from the confirmation page's button; a
        post of the form itself is sent to the confirmation page first."""
        if text(form, "confirm") != "yes":
            query = urlencode(carried(form, ORACLE_FIELDS))
            return RedirectResponse(
                f"/console/datasets/{dataset_id}/gradient-oracles/new?{query}", status_code=303
            )
        c = components(request)
        try:
            with db_session(request) as s:
                d = dataset_service.get_dataset(s, dataset_id).d
            body = oracle_body(form, d)
            oracle = gradient_service.create_oracle(
                c.db, c.store, dataset_id, body, c.settings.gradient_losses
            )
        except (ConsoleRefusal, ServiceError, InputDataError) as exc:
            return refused(request, session, dataset_id, form, exc)
        return RedirectResponse(
            f"/console/datasets/{dataset_id}/gradient-oracles?created={oracle.id}", status_code=303
        )

    def refused(
        request: Request, session: ConsoleSession, dataset_id: int, fields: Fields, exc: Exception
    ) -> HTMLResponse:
        """The form again, with the values entered and why they were refused (at the refusal's status)."""
        if isinstance(exc, ConsoleRefusal):
            status, message = exc.status, exc.message
        elif isinstance(exc, ServiceError):
            status, message = exc.status_code, exc.detail
            if status == 404:  # no such dataset: no form to show again
                raise exc
        else:
            status, message = 422, str(exc)
        return oracles_page(request, session, dataset_id, fields=fields, problem=message, status=status)
