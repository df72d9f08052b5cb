"""The curator console's pages (routes -> the same service functions as the API).

``register`` adds every page to the kit's router: the overview here, the rest in ``pages_datasets``,
``pages_releases``, ``pages_oracles``, ``pages_partners`` and ``pages_queries``. Every page is admin-only
(``SignedIn``: only the admin token signs in), every POST goes through ``FormPost`` (session + CSRF +
Origin) and redirects (303: post/redirect/get, a reload repeats nothing), a new token shown once through an
encrypted flash. What cannot be undone (a release, a gradient oracle: budget spent; revoking a partner or a
token) is posted from a confirmation page, and a post that does not come from it is sent there first.
Every POST is written to the access log with the operator's console session as its actor
(``main.AccessLogMiddleware``).

Privacy rules kept by every page: no raw dataset row or per-row value (features, outcomes, measured or
answered values) is ever rendered; a partner token is shown once, in the answer to its creation; every
asset is served from ``/console/static`` (no external address).
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request, Response
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from curator_service.console import (
    pages_datasets,
    pages_oracles,
    pages_partners,
    pages_queries,
    pages_releases,
)
from curator_service.console.common import ADMIN, db_session
from curator_service.services import datasets as dataset_service
from curator_service.services import partners as partner_service
from curator_service.services import populations as population_service
from curator_service.services import releases as release_service
from shared.protocol.schemas import DatasetPublic, PopulationPublic
from shared.servicekit.console import Console, SignedIn
from shared.servicekit.console.charts import SVG_MEDIA_TYPE, Bar, budget_chart


@dataclass(frozen=True)
class PopulationBudget:
    """One population on the overview: its budget (shared by its datasets) and its datasets."""

    budget: PopulationPublic
    datasets: list[DatasetPublic]

    @property
    def label(self) -> str:
        """``#id name`` (or ``#id`` and its datasets' names when it has no declared name)."""
        named = self.budget.name or ", ".join(d.name for d in self.datasets) or "no dataset"
        return f"#{self.budget.id} {named}"


def population_budgets(session: Session, datasets: list[DatasetPublic]) -> list[PopulationBudget]:
    """Every population with a dataset, once, with its datasets (budgets belong to populations: several
    datasets may share one, and charting it per dataset would show one budget several times)."""
    by_population: dict[int, list[DatasetPublic]] = {}
    for d in datasets:
        by_population.setdefault(d.population_id, []).append(d)
    views = population_service.views(session, population_service.list_populations(session))
    return [PopulationBudget(p, by_population[p.id]) for p in views if p.id in by_population]


def register(console: Console) -> None:
    router = console.router

    @router.get("")
    def overview(request: Request, session: SignedIn) -> HTMLResponse:
        with db_session(request) as s:
            datasets = dataset_service.views(s, dataset_service.list_datasets(s))
            releases = release_service.list_releases(s, ADMIN)
            partners, _, _ = partner_service.list_partners(s)
            pending = pages_queries.pending_manual_queries(s)
            populations = population_budgets(s, datasets)
        context = {
            "datasets": datasets,
            "populations": populations,
            "n_releases": len(releases),
            "n_partners": len(partners),
            "n_active": sum(1 for p in partners if p.revoked_at is None),
            "n_pending": len(pending),
        }
        return console.render(request, "overview.html", context, session=session)

    @router.get("/budget.svg")
    def overview_budget(request: Request, session: SignedIn) -> Response:
        with db_session(request) as s:
            populations = population_budgets(s, dataset_service.views(s, dataset_service.list_datasets(s)))
        bars = [Bar(p.label[:40], p.budget.epsilon_spent, p.budget.epsilon_budget) for p in populations]
        svg = budget_chart(bars, title="epsilon spent and left, per population (its datasets share it)")
        return Response(svg, media_type=SVG_MEDIA_TYPE)

    pages_datasets.register(console)
    pages_releases.register(console)
    pages_oracles.register(console)
    pages_partners.register(console)
    pages_queries.register(console)
