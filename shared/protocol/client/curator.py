"""``CuratorClient``: typed methods over the curator's endpoint table (the request path: ``ApiClient``)."""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shared.protocol.client.apiclient import ApiClient
from shared.protocol.client.base import _check_rows, _check_status, _fsync_replace, _RangedBody
from shared.protocol.client.endpoints import API
from shared.protocol.client.errors import (
    _CHUNK,
    CURATOR_ERRORS,
    ApiUnavailable,
    CuratorError,
    Ledger,
    QueryWaitTimeout,
)
from shared.protocol.schemas import (
    AccessLogPublic,
    CorrectionsPublic,
    DatasetPublic,
    DatasetsPublic,
    GradientOraclePublic,
    GradientOraclesPublic,
    GradientStepResult,
    GradientStepsPublic,
    Health,
    LabQueriesPublic,
    PartnerCreated,
    PartnerPublic,
    PartnersPublic,
    PopulationsPublic,
    PrivacyReport,
    QueriesPublic,
    QueryLogVerification,
    QueryPublic,
    ReleaseDetail,
    ReleasePublic,
    ReleasesPublic,
    ResultsPosted,
    RowExclusions,
)

_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_CONTENT_TOTAL = re.compile(r"bytes \*/(\d+)")


class CuratorClient(ApiClient):
    """Blocking client of the curator API. Thread-safe; use as a context manager or call :meth:`close`.

    The request path (timeouts, retries, errors, TLS ``verify``) is :class:`ApiClient`'s; its errors are the
    ``CuratorError`` family. ``token`` is the admin token (curator staff) or a partner token (a modeler).
    ``transport`` lets tests plug in an ``httpx.MockTransport``. Example (a partner)::

        with CuratorClient("http://127.0.0.1:8001", token=partner_token) as curator:
            release = curator.get_release(1)
            Z = curator.release_rows(1)                      # verified against release.sha256
            q = curator.create_query(1, index=int(Z[:, 0].argmax()), idempotency_key="study-7:1")
            if q.status == "pending":                        # a "manual" dataset: wait for the lab
                q = curator.wait_for_query(q.id)
    """

    errors = CURATOR_ERRORS

    # -- operations ------------------------------------------------------------------------------------
    def healthz(self) -> Health:
        """``GET /healthz`` (no token needed). A 503 answer raises ``CuratorError``."""
        return self._call(API.healthz)

    # -- datasets (admin) ------------------------------------------------------------------------------
    def upload_dataset(
        self,
        path: str | os.PathLike[str],
        *,
        name: str,
        features: list[str] | str | None = None,
        objective: str | None = None,
        objective_mode: str | None = None,
        noise_std: float | None = None,
        scaling: str | dict[str, float] | None = None,
        epsilon_budget: float | None = None,
        delta_budget: float | None = None,
        population: str | None = None,
        acknowledge_distinct_people: bool = False,
        rows_per_person: int | None = None,
        id_column: str | None = None,
    ) -> DatasetPublic:
        """Upload a CSV (streamed from disk) as a new dataset; admin only.

        Example: ``curator.upload_dataset("patients.csv", name="ward-3", objective="outcome",
        scaling={"age": 10.0}, epsilon_budget=10)``. ``acknowledge_distinct_people`` (with ``population``):
        these are other people than the upload their rows match; ``rows_per_person``: at most this many rows
        of one person; ``id_column``: the column of sample ids (kept by the curator for the lab, never a
        feature).
        """
        form = {
            "objective": objective,
            "objective_mode": objective_mode,
            "noise_std": noise_std,
            "epsilon_budget": epsilon_budget,
            "delta_budget": delta_budget,
            "population": population,
            "acknowledge_distinct_people": "true" if acknowledge_distinct_people else None,
            "rows_per_person": rows_per_person,
            "id_column": id_column,
        }
        return self._call(
            API.upload_dataset, path=path, name=name, features=features, scaling=scaling, form=form
        )

    def list_datasets(self) -> DatasetsPublic:
        """Metadata of every dataset (admin)."""
        return self._call(API.list_datasets)

    def get_dataset(self, dataset_id: int) -> DatasetPublic:
        """Metadata of one dataset (admin)."""
        return self._call(API.get_dataset, dataset_id=dataset_id)

    def privacy_report(
        self, dataset_id: int, *, epsilon: float, delta: float, r_max: int | None = None
    ) -> PrivacyReport:
        """What a release at (epsilon, delta) protects, in the curator's units (curator-private; admin)."""
        return self._call(
            API.privacy_report, dataset_id=dataset_id, epsilon=epsilon, delta=delta, r_max=r_max
        )

    def ledger(self, dataset_id: int) -> Ledger:
        """The privacy ledger of the dataset's population: budget, spent, one entry per release (admin)."""
        return self._call(API.ledger, dataset_id=dataset_id)

    def list_populations(self) -> PopulationsPublic:
        """Every population (the people behind one or more datasets): its datasets, budget, spent (admin)."""
        return self._call(API.list_populations)

    # -- releases --------------------------------------------------------------------------------------
    def create_release(
        self,
        dataset_id: int,
        *,
        epsilon: float,
        delta: float,
        r: int | None = None,
        mechanism: str = "gaussian",
        lift: str | None = None,
        acknowledge_no_guarantee: bool = False,
        allow_large_delta: bool = False,
    ) -> ReleaseDetail | ReleasePublic:
        """Spend (epsilon, delta) of the population's budget on a new release (admin; 409 over budget).

        The default is the Gaussian release (``r`` < d optionally projects it); ``mechanism="po-gp-ucb"``
        (the paper's Algorithm 1, no formal guarantee) needs ``r`` and ``acknowledge_no_guarantee=True``.
        """
        return self._call(
            API.create_release,
            dataset_id=dataset_id,
            epsilon=epsilon,
            delta=delta,
            r=r,
            mechanism=mechanism,
            lift=lift,
            acknowledge_no_guarantee=acknowledge_no_guarantee,
            allow_large_delta=allow_large_delta,
        )

    def get_release(self, release_id: int) -> ReleaseDetail | ReleasePublic:
        """A release's parameters (a partner gets ``ReleasePublic``, the admin ``ReleaseDetail``)."""
        return self._call(API.get_release, release_id=release_id)

    def row_exclusions(self, release_id: int) -> RowExclusions:
        """The rows of a granted release this partner token's grant can no longer be answered about (their
        person's output allotment is used up; a query of one is a 409 with ``code == "row-unaffordable"``)."""
        return self._call(API.row_exclusions, release_id=release_id)

    def download_release_rows(
        self,
        release_id: int,
        dest: str | os.PathLike[str],
        *,
        expected_sha256: str | None = None,
        chunk_size: int = _CHUNK,
        max_resumes: int | None = None,
        keep_partial: bool = True,
    ) -> str:
        """Stream the release's rows as .npy into ``dest`` (atomically: partial file, fsync, rename).

        The bytes are checked against ``expected_sha256`` (default: the release's published sha256) before
        ``dest`` appears; a mismatch raises :class:`ReleaseIntegrityError`. Returns the sha256.

        Resumable: the body goes to ``.<dest name>.<sha256[:16]>.part`` beside ``dest``, in ``chunk_size``
        pieces (bounded memory, hashed as they come). When the connection drops mid-body, the next attempt
        asks for the rest only (``Range: bytes=<size>-`` with ``If-Range: "<sha256>"``; a 200 instead of
        the 206 starts over), up to ``max_resumes`` more attempts (default: the client's ``retries``, with
        its backoff). A partial left by an earlier call that failed (or crashed) is continued the same way;
        if the finished file then does not match, it is downloaded once more from the start. A transient
        failure (connection, 5xx) keeps the partial for the next call (unless ``keep_partial`` is False:
        a caller that will not download into this ``dest`` again); any other error deletes it. One download
        per ``dest`` at a time.
        """
        dest = Path(dest)
        expected = expected_sha256 or self.get_release(release_id).sha256
        key = expected if _SHA256.fullmatch(expected) else hashlib.sha256(expected.encode()).hexdigest()
        part = dest.with_name(f".{dest.name}.{key[:16].lower()}.part")
        body = _RangedBody(part, f'"{expected}"', chunk_size)
        call = API.release_rows.bind(release_id=release_id)
        attempts = None if max_resumes is None else max_resumes + 1
        keep = False  # whether a failure leaves the partial for the next call
        try:
            for fresh in (False, True):  # a bad partial: one more pass from byte 0
                resp, digest = self._send(call, into=body, attempts=attempts)
                if resp.status_code == 416 and body.size:  # asked after the end: the partial is all of it?
                    total = _CONTENT_TOTAL.fullmatch(resp.headers.get("content-range", "").strip())
                    if (total is None or int(total.group(1)) != body.size) and not fresh:
                        body.restart()
                        continue
                    digest = body.hexdigest()
                else:
                    _check_status(resp)
                if digest != expected and body.resumed and not fresh:
                    body.restart()
                    continue
                break
            _check_rows(body.path, digest, expected, release_id)
            _fsync_replace(body.path, dest)
            return digest
        except BaseException as exc:
            if not keep_partial:
                pass
            elif isinstance(exc, CuratorError):
                keep = isinstance(exc, ApiUnavailable) or exc.status_code in self.retry_statuses
            else:
                keep = not isinstance(exc, Exception)  # interrupted (KeyboardInterrupt): resumable later
            raise
        finally:
            if not keep:
                body.path.unlink(missing_ok=True)

    def release_rows(self, release_id: int, *, expected_sha256: str | None = None) -> npt.NDArray[np.float64]:
        """The released Z (n x r float64) in memory, verified against the release's sha256."""
        expected = expected_sha256 or self.get_release(release_id).sha256
        content = self._call(API.release_rows, release_id=release_id)
        return _check_rows(content, hashlib.sha256(content).hexdigest(), expected, release_id)

    def list_releases(self, dataset_id: int | None = None) -> ReleasesPublic:
        """Releases you may read (admin: all, or one dataset's; partner: the granted ones)."""
        if dataset_id is None:
            return self._call(API.list_releases)
        return self._call(API.list_dataset_releases, dataset_id=dataset_id)

    # -- partners --------------------------------------------------------------------------------------
    def create_partner(
        self,
        name: str,
        *,
        release_ids: list[int],
        max_queries: int,
        output_privacy: dict[str, Any] | None = None,
        gradient_oracle_ids: list[int] | None = None,
    ) -> PartnerCreated:
        """Grant a modeler organisation access to releases with a query quota; the token is shown once.

        ``output_privacy`` ({epsilon, B, R}, optional fresh_repeats, max_epsilon_per_row, store_raw): every
        outcome answered to it is then privatised by CTL(epsilon)."""
        return self._call(
            API.create_partner,
            name=name,
            release_ids=release_ids,
            max_queries=max_queries,
            output_privacy=output_privacy,
            gradient_oracle_ids=gradient_oracle_ids,
        )

    def list_partners(self) -> PartnersPublic:
        """Every partner with its grants and quota use (admin)."""
        return self._call(API.list_partners)

    def get_partner(self, partner_id: int | None = None) -> PartnerPublic:
        """One partner (admin), or with no id the calling partner itself (``/v1/partners/me``)."""
        if partner_id is None:
            return self._call(API.get_own_partner)
        return self._call(API.get_partner, partner_id=partner_id)

    def grant(self, partner_id: int, release_ids: list[int]) -> PartnerPublic:
        """Grant a partner more releases (admin)."""
        return self._call(API.grant, partner_id=partner_id, release_ids=release_ids)

    def revoke_partner(self, partner_id: int) -> PartnerPublic:
        """Revoke a partner's token (it answers 401 from then on; admin)."""
        return self._call(API.revoke_partner, partner_id=partner_id)

    def access_log(
        self, *, limit: int = 1000, partner_id: int | None = None, after_id: int | None = None
    ) -> AccessLogPublic:
        """Who called what and when, oldest first (admin; never bodies)."""
        return self._call(API.access_log, limit=limit, partner_id=partner_id, after_id=after_id)

    # -- queries ---------------------------------------------------------------------------------------
    def create_query(self, release_id: int, index: int, idempotency_key: str | None = None) -> QueryPublic:
        """Ask the curator for the outcome of row ``index`` of a release (partner).

        Pass a deterministic ``idempotency_key`` (e.g. ``f"{study_id}:{iteration}"``) so that a repeat after
        a crash returns the same query instead of charging the quota again; without one a random key is
        used (still shared by this call's retries). 422 index out of range, 429 quota used up.
        """
        return self._call(
            API.create_query, release_id=release_id, index=index, idempotency_key=idempotency_key
        )

    def get_query(self, query_id: int, *, wait: float | None = None) -> QueryPublic:
        """A query; with ``wait`` the curator holds the request up to that many seconds until it completes."""
        return self._call(API.get_query, query_id=query_id, wait=wait)

    def wait_for_query(
        self,
        query_id: int,
        *,
        timeout: float | None = None,
        poll: float = 30.0,
        stop: Callable[[], bool] | None = None,
    ) -> QueryPublic:
        """Long-poll until the query is complete (``timeout`` None: forever; ``stop()`` true: give up)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic()))
            q = self.get_query(query_id, wait=wait)
            if q.status == "complete":
                return q
            if (deadline is not None and time.monotonic() >= deadline) or (stop is not None and stop()):
                raise QueryWaitTimeout(None, f"query {query_id} is still pending", method="GET")

    def post_result(self, query_id: int, y: float) -> QueryPublic:
        """Post the measured outcome of a pending (``manual``) query (admin; 409 if already complete)."""
        return self._call(API.post_result, query_id=query_id, y=y)

    def list_queries(self, release_id: int) -> QueriesPublic:
        """Queries of a release in creation order (admin: all; partner: its own, which count as delivered
        from then on)."""
        return self._call(API.list_queries, release_id=release_id)

    # -- the lab (admin) -------------------------------------------------------------------------------
    def lab_queries(
        self,
        status: str = "pending",
        *,
        release_id: int | None = None,
        dataset_id: int | None = None,
        after_id: int | None = None,
        limit: int | None = None,
    ) -> LabQueriesPublic:
        """Queries of ``manual`` datasets across releases (``status`` "pending": waiting for a measurement,
        or "complete"), oldest first, each with its row's ``sample_id`` when the dataset has an id column."""
        return self._call(
            API.lab_queries,
            status=status,
            release_id=release_id,
            dataset_id=dataset_id,
            after_id=after_id,
            limit=limit,
        )

    def post_results(self, path: str | os.PathLike[str], *, release_id: int | None = None) -> ResultsPosted:
        """Post the measurements of a CSV (``y`` and one of ``query_id``, ``sample_id``, ``index``; optional
        ``release_id``) in one transaction: a bad line is refused with its number, and nothing is posted."""
        return self._call(API.post_results, path=path, release_id=release_id)

    def correct_result(self, query_id: int, y: float, *, reason: str) -> QueryPublic:
        """Change a posted measurement: replaced while no partner was sent it, superseded (both values kept,
        the partner told through the query's ``corrections``) after. Not retried (a repeat is a second
        change)."""
        return self._call(API.correct_result, query_id=query_id, y=y, reason=reason)

    def list_corrections(
        self, release_id: int, *, after_id: int | None = None, limit: int | None = None
    ) -> CorrectionsPublic:
        """Changed values of a release's queries in the order recorded (admin: all, with reasons; partner:
        the supersessions of its own queries, to record beside the first answers in its audit log)."""
        return self._call(API.list_corrections, release_id=release_id, after_id=after_id, limit=limit)

    def verify_queries(self, release_id: int) -> QueryLogVerification:
        """Check the release's query-log hash chain on the curator (admin, or the granted partner)."""
        return self._call(API.verify_queries, release_id=release_id)

    # -- gradient oracles (DP-GIBO) --------------------------------------------------------------------
    def create_gradient_oracle(self, dataset_id: int, **body: Any) -> GradientOraclePublic:
        """A private gradient oracle on a dataset (admin): its whole mu-GDP cost is charged at once.

        ``body``: loss, dimension, bounds, clip, mu, steps, delta (+ intercept, delta_huber, weight_clip)."""
        return self._call(API.create_gradient_oracle, dataset_id=dataset_id, body=body)

    def list_gradient_oracles(self) -> GradientOraclesPublic:
        """The oracles you may read (admin: all; partner: granted)."""
        return self._call(API.list_gradient_oracles)

    def get_gradient_oracle(self, oracle_id: int) -> GradientOraclePublic:
        """One oracle: its public parameters, steps used and mu spent."""
        return self._call(API.get_gradient_oracle, oracle_id=oracle_id)

    def gradient_step(
        self, oracle_id: int, body: dict[str, Any], *, idempotency_key: str | None = None
    ) -> GradientStepResult:
        """One private gradient (partner): ``body`` = {theta, points, kernel, noise_var?, jitter?}.

        A repeat with the same ``idempotency_key`` returns the stored answer (no second step)."""
        return self._call(API.gradient_step, oracle_id=oracle_id, body=body, idempotency_key=idempotency_key)

    def list_gradient_steps(self, oracle_id: int) -> GradientStepsPublic:
        """The steps answered (admin: all; partner: its own)."""
        return self._call(API.list_gradient_steps, oracle_id=oracle_id)
