"""The curator's own series of ``GET /metrics`` (``shared.servicekit.metrics``), read from the database at
each scrape: queries answered, and each population's budget spent and left. Population ids only as labels
(never a name or a data value)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from curator_service import repository as repo
from curator_service.db import Database
from shared.servicekit.metrics import DomainSeries


def domain_series(db: Database) -> DomainSeries:
    def collect() -> Iterable[Metric]:
        with db.session(write=False) as session:
            answered = repo.count_answered_queries(session)
            populations = repo.list_populations(session)
            spent = repo.ledger_totals_by_population(session)
        queries = CounterMetricFamily(
            "pobo_curator_queries_answered", "Outcome queries answered (complete), over every release."
        )
        queries.add_metric([], answered)
        families: list[Metric] = [queries]
        for what in ("epsilon", "delta"):
            used = GaugeMetricFamily(
                f"pobo_curator_budget_{what}_spent",
                f"{what} spent from a population's budget (ledger, basic composition; reservations count).",
                labels=["population"],
            )
            left = GaugeMetricFamily(
                f"pobo_curator_budget_{what}_left",
                f"{what} left of a population's budget (budget minus spent, at least 0).",
                labels=["population"],
            )
            for population in populations:
                budget = population.epsilon_budget if what == "epsilon" else population.delta_budget
                total = spent.get(population.id, (0.0, 0.0))[0 if what == "epsilon" else 1]
                used.add_metric([str(population.id)], total)
                left.add_metric([str(population.id)], max(0.0, budget - total))
            families += [used, left]
        return families

    return collect
