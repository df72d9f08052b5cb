"""The modeler's own series of ``GET /metrics`` (``shared.servicekit.metrics``), read from the database at
each scrape: studies by status, and the rounds closed by studies and by federations."""

from __future__ import annotations

from collections.abc import Iterable
from typing import get_args

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from modeler_service import repository as repo
from modeler_service.db import Database, transaction
from modeler_service.federations import repository as federation_repo
from shared.protocol.schemas.studies import StudyStatus
from shared.servicekit.metrics import DomainSeries

#: Every status a study can have (listed at 0 when no study has it, so a series never vanishes).
STUDY_STATUSES: tuple[str, ...] = get_args(StudyStatus)


def domain_series(db: Database) -> DomainSeries:
    def collect() -> Iterable[Metric]:
        with transaction(db, write=False) as session:
            statuses = repo.studies_by_status(session)
            study_rounds = repo.study_rounds_done(session)
            federation_rounds = federation_repo.federation_rounds_closed(session)
        studies = GaugeMetricFamily("pobo_modeler_studies", "Studies by status.", labels=["status"])
        for status in sorted(set(STUDY_STATUSES) | set(statuses)):
            studies.add_metric([status], statuses.get(status, 0))
        rounds = CounterMetricFamily(
            "pobo_modeler_rounds_closed",
            "Rounds closed: a study's recorded rounds, a federation's closed rounds.",
            labels=["kind"],
        )
        rounds.add_metric(["study"], study_rounds)
        rounds.add_metric(["federation"], federation_rounds)
        return [studies, rounds]

    return collect
