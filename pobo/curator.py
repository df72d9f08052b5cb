"""``pobo.Curator``: the data holder's calls (admin token), on
:class:`shared.protocol.client.CuratorClient`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pobo._service import Service
from pobo._tables import as_csv
from shared.protocol.client import CuratorClient, Ledger
from shared.protocol.schemas import (
    AccessLogPublic,
    DatasetPublic,
    DatasetsPublic,
    LabQueriesPublic,
    PartnerCreated,
    PartnerPublic,
    PartnersPublic,
    PopulationsPublic,
    PrivacyReport,
    QueryPublic,
    ReleaseDetail,
    ReleasePublic,
    ReleasesPublic,
    ResultsPosted,
)

__all__ = ["Curator"]


class Curator(Service[CuratorClient]):
    """The curator service, as its admin: datasets, privacy reports, releases, partners, the lab's queries.

    ``Curator(url, token)`` with the admin token; ``**client_options`` go to ``CuratorClient`` (``timeout``,
    ``retries``, ``verify`` for TLS). Use it as a context manager or call :meth:`close`. Answers are the
    API's models; errors are :class:`pobo.CuratorError` (``status_code``, ``detail``: the API's message).
    The underlying client is :attr:`client` for anything not wrapped here.
    """

    _label = "pobo.Curator"

    def __init__(self, url: str, token: str, **client_options: Any) -> None:
        super().__init__(CuratorClient(url, token, **client_options), url)

    # -- datasets --------------------------------------------------------------------------------------
    def upload(
        self,
        table: Any,
        *,
        name: str,
        objective: str | None = None,
        columns: Sequence[str] | None = None,
        **form: Any,
    ) -> DatasetPublic:
        """Upload a table as a new dataset (``POST /v1/datasets``).

        ``table``: a CSV path, a pandas DataFrame, or a 2-D numpy array with ``columns=`` (its column names).
        ``objective``: the outcome column (kept by the curator; omit it for a ``manual`` dataset measured by a
        lab). ``**form``: the other upload fields, e.g. ``features=[...]``, ``scaling={"age": 10.0}``,
        ``epsilon_budget``, ``delta_budget``, ``population``, ``id_column``, ``noise_std``.
        """
        with as_csv(table, columns) as path:
            return self.client.upload_dataset(path, name=name, objective=objective, **form)

    def datasets(self) -> DatasetsPublic:
        """Every dataset's metadata (``data``, ``count``)."""
        return self.client.list_datasets()

    def dataset(self, dataset_id: int) -> DatasetPublic:
        """One dataset's metadata."""
        return self.client.get_dataset(dataset_id)

    def privacy_report(
        self, dataset_id: int, *, epsilon: float, delta: float, r_max: int | None = None
    ) -> PrivacyReport:
        """What a release at (epsilon, delta) would protect, in the dataset's units (curator-private)."""
        return self.client.privacy_report(dataset_id, epsilon=epsilon, delta=delta, r_max=r_max)

    def ledger(self, dataset_id: int) -> Ledger:
        """The privacy ledger of the dataset's population: budget, spent, one entry per charge."""
        return self.client.ledger(dataset_id)

    def populations(self) -> PopulationsPublic:
        """Every population (the people behind one or more datasets) with its budget and what is spent."""
        return self.client.list_populations()

    # -- releases --------------------------------------------------------------------------------------
    def release(
        self, dataset_id: int, *, epsilon: float, delta: float, **options: Any
    ) -> ReleaseDetail | ReleasePublic:
        """Spend (epsilon, delta) of the population's budget on a release (409 over budget, nothing spent).

        ``**options``: ``r`` (a projection to r < d columns), ``mechanism`` (``"gaussian"`` default, or
        ``"po-gp-ucb"`` with ``acknowledge_no_guarantee=True``), ``lift``, ``allow_large_delta``.
        """
        return self.client.create_release(dataset_id, epsilon=epsilon, delta=delta, **options)

    def releases(self, dataset_id: int | None = None) -> ReleasesPublic:
        """Every release, or one dataset's."""
        return self.client.list_releases(dataset_id)

    # -- partners --------------------------------------------------------------------------------------
    def create_partner(
        self, *, name: str, release_ids: list[int], max_queries: int, **options: Any
    ) -> PartnerCreated:
        """A modeler organisation with access to ``release_ids`` and a query quota; its ``token`` is shown
        only in this answer. ``**options``: ``output_privacy`` ({epsilon, B, R}), ``gradient_oracle_ids``."""
        return self.client.create_partner(name, release_ids=release_ids, max_queries=max_queries, **options)

    def partners(self) -> PartnersPublic:
        """Every partner with its grants and quota use."""
        return self.client.list_partners()

    def grant(self, partner_id: int, release_ids: list[int]) -> PartnerPublic:
        """Grant a partner more releases."""
        return self.client.grant(partner_id, release_ids)

    def access_log(
        self, *, limit: int = 1000, partner_id: int | None = None, after_id: int | None = None
    ) -> AccessLogPublic:
        """Who called what and when, oldest first (never request bodies)."""
        return self.client.access_log(limit=limit, partner_id=partner_id, after_id=after_id)

    # -- the lab ---------------------------------------------------------------------------------------
    def pending_queries(self, **filters: Any) -> LabQueriesPublic:
        """Queries waiting for a measurement (``GET /v1/queries?status=pending``), oldest first, each with
        its row's ``sample_id`` if the dataset has an id column. ``**filters``: ``release_id``,
        ``dataset_id``, ``after_id``, ``limit``."""
        return self.client.lab_queries("pending", **filters)

    def post_result(self, query_id: int, y: float) -> QueryPublic:
        """The measured outcome of a pending query (409 if it is already complete)."""
        return self.client.post_result(query_id, y)

    def post_results(
        self, table: Any, *, release_id: int | None = None, columns: Sequence[str] | None = None
    ) -> ResultsPosted:
        """Many measurements in one transaction: a table (CSV path, DataFrame, or array with ``columns=``)
        with ``y`` and one of ``query_id``, ``sample_id``, ``index``; a bad line is refused with its number
        and nothing is posted."""
        with as_csv(table, columns) as path:
            return self.client.post_results(path, release_id=release_id)
