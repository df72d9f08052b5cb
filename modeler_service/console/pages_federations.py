"""The modeler console's federation pages (DP-FTS-DE, the modeler as coordinator): read-only.

* ``/console/federations``: every federation (status, round, agents, epsilon of its budget).
* ``/console/federations/{id}``: its public parameters, its rounds (times, epsilon after each, how many
  submissions each accepted), a chart of epsilon over the rounds against the budget
  (``.../epsilon.svg``), and its agents with the last round that accepted a submission of theirs.

Federations are created, joined and started through the API (``/v1/federations``, ``pobo agent run``);
nothing here changes one. No page shows an omega or a round's Poisson sample.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import Request, Response
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from modeler_service.api.deps import Components
from modeler_service.db import transaction
from modeler_service.federations import list_federations
from modeler_service.federations.views import FederationDetail, federation_detail
from shared.servicekit.console import Console, SignedIn
from shared.servicekit.console.charts import SVG_MEDIA_TYPE, Series, line_chart

#: The parameters shown on a federation's page, in this order (label, key of ``params``).
PARAMS = [
    ("Dimension", "dimension"),
    ("Box", "bounds"),
    ("Sub-regions P", "P"),
    ("Random features M", "M"),
    ("Sampling probability q", "q"),
    ("Noise multiplier z", "z"),
    ("Clipping bound S", "S"),
    ("Rounds", "rounds"),
    ("epsilon budget (PLD)", "epsilon_budget"),
    ("delta", "delta"),
    ("Seconds per round", "round_seconds"),
]


@contextmanager
def _read(request: Request) -> Iterator[Session]:
    components: Components = request.app.state.components
    with transaction(components.ctx.db, write=False) as session:
        yield session


def epsilon_chart(detail: FederationDetail) -> bytes:
    """epsilon after each closed round (PLD and RDP), with the budget as a flat line."""
    closed = [r for r in detail.rounds if r.epsilon_pld is not None]
    xs = [float(r.number) for r in closed]
    series = [
        Series("epsilon (PLD)", xs, [float(r.epsilon_pld or 0.0) for r in closed], markers=True),
        Series("epsilon (RDP)", xs, [float(r.epsilon_rdp or 0.0) for r in closed], markers=True),
    ]
    if closed:
        budget = float(detail.federation.params["epsilon_budget"])
        series.append(Series("budget", [xs[0], xs[-1]], [budget, budget]))
    return line_chart(
        series,
        title="epsilon after each round",
        xlabel="round",
        ylabel="epsilon",
        empty="no round closed yet",
    )


def register(console: Console) -> None:
    router = console.router

    @router.get("/federations")
    def federations(request: Request, session: SignedIn) -> HTMLResponse:
        with _read(request) as db:
            data = list_federations(db).data
        rows: list[dict[str, Any]] = [
            {
                "federation": f,
                "agents": len(f.agents or []),
                "rounds": int(f.params["rounds"]),
                "budget": float(f.params["epsilon_budget"]),
            }
            for f in data
        ]
        return console.render(request, "federations.html", {"rows": rows}, session=session)

    @router.get("/federations/{federation_id}")
    def federation(request: Request, federation_id: str, session: SignedIn) -> HTMLResponse:
        with _read(request) as db:
            detail = federation_detail(db, federation_id)
        params = detail.federation.params
        context = {
            "f": detail.federation,
            "rounds": detail.rounds,
            "agents": detail.agents,
            "params": [(label, params[key]) for label, key in PARAMS if key in params],
            "active": detail.federation.status != "done",
        }
        return console.render(request, "federation.html", context, session=session)

    @router.get("/federations/{federation_id}/epsilon.svg")
    def federation_chart(request: Request, federation_id: str, session: SignedIn) -> Response:
        with _read(request) as db:
            detail = federation_detail(db, federation_id)
        return Response(epsilon_chart(detail), media_type=SVG_MEDIA_TYPE)
