"""The curator console's pages (routes -> the same service functions as the API).

``register`` adds every page to the kit's router: the overview here, the rest in ``pages_datasets``,
``pages_releases``, ``pages_partners`` and ``pages_queries``. Every page is admin-only (``SignedIn``: only
the admin token signs in), every POST goes through ``FormPost`` (session + CSRF + Origin) and redirects
(303) back to its page, except the partner creation that shows the new token once.

Privacy rules kept by every page: no raw dataset row or per-row value (features, outcomes, measured or
answered values) is ever rendered; a partner token is shown once, in the answer to its creation; every
asset is served from ``/console/static`` (no external address).
"""

from __future__ import annotations

from fastapi import Request, Response
from fastapi.responses import HTMLResponse

from curator_service.console import pages_datasets, pages_partners, pages_queries, pages_releases
from curator_service.console.common import ADMIN, db_session
from curator_service.services import datasets as dataset_service
from curator_service.services import partners as partner_service
from curator_service.services import populations as population_service
from curator_service.services import releases as release_service
from shared.servicekit.console import Console, SignedIn
from shared.servicekit.console.charts import SVG_MEDIA_TYPE, Bar, budget_chart


def register(console: Console) -> None:
    router = console.router

    @router.get("")
    def overview(request: Request, session: SignedIn) -> HTMLResponse:
        with db_session(request) as s:
            datasets = dataset_service.views(s, dataset_service.list_datasets(s))
            releases = release_service.list_releases(s, ADMIN)
            partners, _, _ = partner_service.list_partners(s)
            pending = pages_queries.pending_manual_queries(s)
            unproven = [
                p.id
                for p in population_service.views(s, population_service.list_populations(s))
                if not p.formal_guarantee
            ]
        context = {
            "datasets": datasets,
            "unproven": unproven,
            "n_releases": len(releases),
            "n_partners": len(partners),
            "n_active": sum(1 for p in partners if p.revoked_at is None),
            "n_pending": len(pending),
        }
        return console.render(request, "overview.html", context, session=session)

    @router.get("/budget.svg")
    def overview_budget(request: Request, session: SignedIn) -> Response:
        with db_session(request) as s:
            datasets = dataset_service.views(s, dataset_service.list_datasets(s))
        bars = [Bar(f"#{d.id} {d.name[:24]}", d.epsilon_spent, d.epsilon_budget) for d in datasets]
        svg = budget_chart(bars, title="epsilon spent and left, per dataset (its population's budget)")
        return Response(svg, media_type=SVG_MEDIA_TYPE)

    pages_datasets.register(console)
    pages_releases.register(console)
    pages_partners.register(console)
    pages_queries.register(console)
