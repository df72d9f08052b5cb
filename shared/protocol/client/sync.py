"""The synchronous curator client (the modeler service, scripts, notebooks)."""

from __future__ import annotations

import hashlib
import io
import os
import ssl
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
from tenacity import (
    Retrying,
)

from shared.protocol.client.base import (
    _Base,
    _Call,
    _decode,
    _files,
    _fsync_replace,
    _parse,
    _release_model,
    _transport_errors,
    _verify,
)
from shared.protocol.client.errors import (
    _CHUNK,
    RETRY_STATUSES,
    Ledger,
    QueryWaitTimeout,
    ReleaseIntegrityError,
    _error_from,
)
from shared.protocol.schemas import (
    AccessLogPublic,
    DatasetPublic,
    DatasetsPublic,
    Health,
    PartnerCreated,
    PartnerPublic,
    PartnersPublic,
    PrivacyReport,
    QueriesPublic,
    QueryLogVerification,
    QueryPublic,
    ReleaseDetail,
    ReleasePublic,
    ReleasesPublic,
)


class CuratorClient(_Base):
    """Blocking client of the curator API. Thread-safe; use as a context manager or call :meth:`close`.

    ``token`` is the admin token (curator staff) or a partner token (a modeler). ``transport`` lets tests
    plug in an ``httpx.MockTransport``. Example (a partner)::

        with CuratorClient("http://127.0.0.1:8001", token=partner_token) as curator:
            release = curator.get_release(1)
            Z = curator.release_rows(1)                      # verified against release.sha256
            q = curator.create_query(1, index=int(Z[:, 0].argmax()), idempotency_key="study-7:1")
            if q.status == "pending":                        # a "manual" dataset: wait for the lab
                q = curator.wait_for_query(q.id)
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 4,
        backoff: float = 0.2,
        max_backoff: float = 5.0,
        transport: httpx.BaseTransport | None = None,
        verify: ssl.SSLContext | str | Path | bool = True,
    ) -> None:
        super().__init__(
            base_url, token, timeout=timeout, retries=retries, backoff=backoff, max_backoff=max_backoff
        )
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=self._headers(),
            timeout=self._timeout(),
            transport=transport,
            verify=_verify(verify),
        )

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> CuratorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing --------------------------------------------------------------------------------------
    def _send_once(self, call: _Call) -> httpx.Response:
        with _transport_errors(call), _files(call) as files:
            resp = self._http.request(
                call.method,
                call.path,
                params=call.params,
                json=call.json,
                data=call.data,
                files=files,
                headers=call.headers,
                timeout=self._timeout(call.extra_timeout),
            )
        if resp.status_code in RETRY_STATUSES:
            raise _error_from(resp)
        return resp

    def _request(self, call: _Call) -> Any:
        for attempt in Retrying(**self._retry_kwargs(call)):
            with attempt:
                resp = self._send_once(call)
        return _decode(resp)

    def _download(self, call: _Call, dest: Path) -> str:
        """Stream the response body into ``dest`` (rewritten from scratch on every attempt); its sha256."""
        digest = ""
        for attempt in Retrying(**self._retry_kwargs(call)):
            with attempt:
                h = hashlib.sha256()
                with (
                    _transport_errors(call),
                    self._http.stream(
                        call.method,
                        call.path,
                        headers=call.headers,
                        timeout=self._timeout(call.extra_timeout),
                    ) as resp,
                ):
                    if resp.status_code >= 400:
                        resp.read()
                        raise _error_from(resp)
                    with open(dest, "wb") as fh:
                        for chunk in resp.iter_bytes(_CHUNK):
                            h.update(chunk)
                            fh.write(chunk)
                digest = h.hexdigest()
        return digest

    # -- operations ------------------------------------------------------------------------------------
    def healthz(self) -> Health:
        """``GET /healthz`` (no token needed). A 503 answer raises ``CuratorError``."""
        return _parse(Health, self._request(_Call("GET", "/healthz")))

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
    ) -> DatasetPublic:
        """Upload a CSV (streamed from disk) as a new dataset; admin only.

        Example: ``curator.upload_dataset("patients.csv", name="ward-3", objective="outcome",
        scaling={"age": 10.0}, epsilon_budget=10)``.
        """
        call = self._upload_call(
            path,
            name=name,
            features=features,
            objective=objective,
            objective_mode=objective_mode,
            noise_std=noise_std,
            scaling=scaling,
            epsilon_budget=epsilon_budget,
            delta_budget=delta_budget,
            population=population,
        )
        return _parse(DatasetPublic, self._request(call))

    def list_datasets(self) -> DatasetsPublic:
        """Metadata of every dataset (admin)."""
        return _parse(DatasetsPublic, self._request(_Call("GET", "/v1/datasets")))

    def get_dataset(self, dataset_id: int) -> DatasetPublic:
        """Metadata of one dataset (admin)."""
        return _parse(DatasetPublic, self._request(_Call("GET", f"/v1/datasets/{int(dataset_id)}")))

    def privacy_report(
        self, dataset_id: int, *, epsilon: float, delta: float, r_max: int | None = None
    ) -> PrivacyReport:
        """What a release at (epsilon, delta) protects, in the curator's units (curator-private; admin)."""
        params: dict[str, Any] = {"epsilon": epsilon, "delta": delta}
        if r_max is not None:
            params["r_max"] = r_max
        data = self._request(_Call("GET", f"/v1/datasets/{int(dataset_id)}/privacy", params=params))
        return _parse(PrivacyReport, data)

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
        call = self._release_call(
            dataset_id, epsilon, delta, r, mechanism, lift, acknowledge_no_guarantee, allow_large_delta
        )
        return _release_model(self._request(call))

    def get_release(self, release_id: int) -> ReleaseDetail | ReleasePublic:
        """A release's parameters (a partner gets ``ReleasePublic``, the admin ``ReleaseDetail``)."""
        return _release_model(self._request(_Call("GET", f"/v1/releases/{int(release_id)}")))

    def download_release_rows(
        self, release_id: int, dest: str | os.PathLike[str], *, expected_sha256: str | None = None
    ) -> str:
        """Stream the release's rows as .npy into ``dest`` (atomically: temp file, fsync, rename).

        The bytes are checked against ``expected_sha256`` (default: the release's published sha256) before
        ``dest`` appears; a mismatch raises :class:`ReleaseIntegrityError`. Returns the sha256.
        """
        dest = Path(dest)
        expected = expected_sha256 or self.get_release(release_id).sha256
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.part")
        try:
            digest = self._download(self._rows_call(release_id), tmp)
            self._check_rows(tmp, digest, expected, release_id)
            _fsync_replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        return digest

    def release_rows(self, release_id: int, *, expected_sha256: str | None = None) -> npt.NDArray[np.float64]:
        """The released Z (n x r float64) in memory, verified against the release's sha256."""
        expected = expected_sha256 or self.get_release(release_id).sha256
        for attempt in Retrying(**self._retry_kwargs(self._rows_call(release_id))):
            with attempt:
                resp = self._send_once(self._rows_call(release_id))
        if resp.status_code >= 400:
            raise _error_from(resp)
        digest = hashlib.sha256(resp.content).hexdigest()
        if digest != expected:
            raise ReleaseIntegrityError(
                None, f"release {release_id} rows have sha256 {digest}, but the release says {expected}"
            )
        Z: npt.NDArray[np.float64] = np.load(io.BytesIO(resp.content), allow_pickle=False)
        return Z

    def ledger(self, dataset_id: int) -> Ledger:
        """The privacy ledger of the dataset's population: budget, spent, one entry per release (admin)."""
        return _parse(Ledger, self._request(_Call("GET", f"/v1/datasets/{int(dataset_id)}/ledger")))

    def list_releases(self, dataset_id: int | None = None) -> ReleasesPublic:
        """Releases you may read (admin: all, or one dataset's; partner: the granted ones)."""
        path = f"/v1/datasets/{int(dataset_id)}/releases" if dataset_id is not None else "/v1/releases"
        return _parse(ReleasesPublic, self._request(_Call("GET", path)))

    def list_partners(self) -> PartnersPublic:
        """Every partner with its grants and quota use (admin)."""
        return _parse(PartnersPublic, self._request(_Call("GET", "/v1/partners")))

    def get_partner(self, partner_id: int | None = None) -> PartnerPublic:
        """One partner (admin), or with no id the calling partner itself (``/v1/partners/me``)."""
        path = "/v1/partners/me" if partner_id is None else f"/v1/partners/{int(partner_id)}"
        return _parse(PartnerPublic, self._request(_Call("GET", path)))

    def grant(self, partner_id: int, release_ids: list[int]) -> PartnerPublic:
        """Grant a partner more releases (admin)."""
        body = {"release_ids": [int(i) for i in release_ids]}
        call = _Call("POST", f"/v1/partners/{int(partner_id)}/grants", json=body, idempotent=True)
        return _parse(PartnerPublic, self._request(call))

    def revoke_partner(self, partner_id: int) -> PartnerPublic:
        """Revoke a partner's token (it answers 401 from then on; admin)."""
        call = _Call("DELETE", f"/v1/partners/{int(partner_id)}", idempotent=True)
        return _parse(PartnerPublic, self._request(call))

    def access_log(
        self, *, limit: int = 1000, partner_id: int | None = None, after_id: int | None = None
    ) -> AccessLogPublic:
        """Who called what and when, oldest first (admin; never bodies)."""
        params = {
            k: v
            for k, v in {"limit": limit, "partner_id": partner_id, "after_id": after_id}.items()
            if v is not None
        }
        return _parse(AccessLogPublic, self._request(_Call("GET", "/v1/access-log", params=params)))

    # -- partners (admin) ------------------------------------------------------------------------------
    def create_partner(self, name: str, *, release_ids: list[int], max_queries: int) -> PartnerCreated:
        """Grant a modeler organisation access to releases with a query quota; the token is shown once."""
        body = {"name": name, "release_ids": [int(i) for i in release_ids], "max_queries": int(max_queries)}
        return _parse(
            PartnerCreated, self._request(_Call("POST", "/v1/partners", json=body, idempotent=False))
        )

    # -- queries ---------------------------------------------------------------------------------------
    def create_query(self, release_id: int, index: int, idempotency_key: str | None = None) -> QueryPublic:
        """Ask the curator for the outcome of row ``index`` of a release (partner).

        Pass a deterministic ``idempotency_key`` (e.g. ``f"{study_id}:{iteration}"``) so that a repeat after
        a crash returns the same query instead of charging the quota again; without one a random key is
        used (still shared by this call's retries). 422 index out of range, 429 quota used up.
        """
        return _parse(QueryPublic, self._request(self._query_call(release_id, index, idempotency_key)))

    def get_query(self, query_id: int, *, wait: float | None = None) -> QueryPublic:
        """A query; with ``wait`` the curator holds the request up to that many seconds until it completes."""
        return _parse(QueryPublic, self._request(self._get_query_call(query_id, wait)))

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
        call = _Call("POST", f"/v1/queries/{int(query_id)}/result", json={"y": float(y)}, idempotent=False)
        return _parse(QueryPublic, self._request(call))

    def list_queries(self, release_id: int) -> QueriesPublic:
        """Queries of a release in creation order (admin: all; partner: its own)."""
        return _parse(QueriesPublic, self._request(_Call("GET", f"/v1/releases/{int(release_id)}/queries")))

    def verify_queries(self, release_id: int) -> QueryLogVerification:
        """Check the release's query-log hash chain on the curator (admin, or the granted partner)."""
        return _parse(
            QueryLogVerification,
            self._request(_Call("GET", f"/v1/releases/{int(release_id)}/queries/verify")),
        )

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Escape hatch for endpoints without a method here: decoded JSON, same retries and errors."""
        idempotent = method.upper() == "GET" or "Idempotency-Key" in kwargs.get("headers", {})
        return self._request(_Call(method.upper(), path, idempotent=idempotent, **kwargs))
