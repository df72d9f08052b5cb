"""The asynchronous curator client (asyncio code, e.g. a notebook with an event loop)."""

from __future__ import annotations

import hashlib
import io
import os
import ssl
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
from tenacity import (
    AsyncRetrying,
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


class AsyncCuratorClient(_Base):
    """The same API as :class:`CuratorClient`, awaitable (``httpx.AsyncClient``). Example::

    async with AsyncCuratorClient("http://127.0.0.1:8001", token=partner_token) as curator:
        q = await curator.create_query(1, index=42, idempotency_key="study-7:1")
        q = await curator.get_query(q.id, wait=30)
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
        transport: httpx.AsyncBaseTransport | None = None,
        verify: ssl.SSLContext | str | Path | bool = True,
    ) -> None:
        super().__init__(
            base_url, token, timeout=timeout, retries=retries, backoff=backoff, max_backoff=max_backoff
        )
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers=self._headers(),
            timeout=self._timeout(),
            transport=transport,
            verify=_verify(verify),
        )

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> AsyncCuratorClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send_once(self, call: _Call) -> httpx.Response:
        with _transport_errors(call), _files(call) as files:
            resp = await self._http.request(
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

    async def _request(self, call: _Call) -> Any:
        async for attempt in AsyncRetrying(**self._retry_kwargs(call)):
            with attempt:
                resp = await self._send_once(call)
        return _decode(resp)

    async def _download(self, call: _Call, dest: Path) -> str:
        digest = ""
        async for attempt in AsyncRetrying(**self._retry_kwargs(call)):
            with attempt:
                h = hashlib.sha256()
                with _transport_errors(call):
                    async with self._http.stream(
                        call.method,
                        call.path,
                        headers=call.headers,
                        timeout=self._timeout(call.extra_timeout),
                    ) as resp:
                        if resp.status_code >= 400:
                            await resp.aread()
                            raise _error_from(resp)
                        with open(dest, "wb") as fh:  # noqa: ASYNC230 - small sequential writes
                            async for chunk in resp.aiter_bytes(_CHUNK):
                                h.update(chunk)
                                fh.write(chunk)
                digest = h.hexdigest()
        return digest

    async def healthz(self) -> Health:
        """``GET /healthz``."""
        return _parse(Health, await self._request(_Call("GET", "/healthz")))

    async def upload_dataset(
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
        """See :meth:`CuratorClient.upload_dataset`."""
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
        return _parse(DatasetPublic, await self._request(call))

    async def list_datasets(self) -> DatasetsPublic:
        return _parse(DatasetsPublic, await self._request(_Call("GET", "/v1/datasets")))

    async def get_dataset(self, dataset_id: int) -> DatasetPublic:
        return _parse(DatasetPublic, await self._request(_Call("GET", f"/v1/datasets/{int(dataset_id)}")))

    async def privacy_report(
        self, dataset_id: int, *, epsilon: float, delta: float, r_max: int | None = None
    ) -> PrivacyReport:
        params: dict[str, Any] = {"epsilon": epsilon, "delta": delta}
        if r_max is not None:
            params["r_max"] = r_max
        data = await self._request(_Call("GET", f"/v1/datasets/{int(dataset_id)}/privacy", params=params))
        return _parse(PrivacyReport, data)

    async def create_release(
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
        """See :meth:`CuratorClient.create_release`."""
        call = self._release_call(
            dataset_id, epsilon, delta, r, mechanism, lift, acknowledge_no_guarantee, allow_large_delta
        )
        return _release_model(await self._request(call))

    async def get_release(self, release_id: int) -> ReleaseDetail | ReleasePublic:
        return _release_model(await self._request(_Call("GET", f"/v1/releases/{int(release_id)}")))

    async def download_release_rows(
        self, release_id: int, dest: str | os.PathLike[str], *, expected_sha256: str | None = None
    ) -> str:
        """See :meth:`CuratorClient.download_release_rows`."""
        dest = Path(dest)
        expected = expected_sha256 or (await self.get_release(release_id)).sha256
        tmp = dest.with_name(f".{dest.name}.{uuid.uuid4().hex}.part")
        try:
            digest = await self._download(self._rows_call(release_id), tmp)
            self._check_rows(tmp, digest, expected, release_id)
            _fsync_replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)
        return digest

    async def release_rows(
        self, release_id: int, *, expected_sha256: str | None = None
    ) -> npt.NDArray[np.float64]:
        expected = expected_sha256 or (await self.get_release(release_id)).sha256
        call = self._rows_call(release_id)
        async for attempt in AsyncRetrying(**self._retry_kwargs(call)):
            with attempt:
                resp = await self._send_once(call)
        if resp.status_code >= 400:
            raise _error_from(resp)
        digest = hashlib.sha256(resp.content).hexdigest()
        if digest != expected:
            raise ReleaseIntegrityError(
                None, f"release {release_id} rows have sha256 {digest}, but the release says {expected}"
            )
        Z: npt.NDArray[np.float64] = np.load(io.BytesIO(resp.content), allow_pickle=False)
        return Z

    async def ledger(self, dataset_id: int) -> Ledger:
        return _parse(Ledger, await self._request(_Call("GET", f"/v1/datasets/{int(dataset_id)}/ledger")))

    async def list_releases(self, dataset_id: int | None = None) -> ReleasesPublic:
        path = f"/v1/datasets/{int(dataset_id)}/releases" if dataset_id is not None else "/v1/releases"
        return _parse(ReleasesPublic, await self._request(_Call("GET", path)))

    async def list_partners(self) -> PartnersPublic:
        return _parse(PartnersPublic, await self._request(_Call("GET", "/v1/partners")))

    async def get_partner(self, partner_id: int | None = None) -> PartnerPublic:
        path = "/v1/partners/me" if partner_id is None else f"/v1/partners/{int(partner_id)}"
        return _parse(PartnerPublic, await self._request(_Call("GET", path)))

    async def grant(self, partner_id: int, release_ids: list[int]) -> PartnerPublic:
        body = {"release_ids": [int(i) for i in release_ids]}
        call = _Call("POST", f"/v1/partners/{int(partner_id)}/grants", json=body, idempotent=True)
        return _parse(PartnerPublic, await self._request(call))

    async def revoke_partner(self, partner_id: int) -> PartnerPublic:
        call = _Call("DELETE", f"/v1/partners/{int(partner_id)}", idempotent=True)
        return _parse(PartnerPublic, await self._request(call))

    async def access_log(
        self, *, limit: int = 1000, partner_id: int | None = None, after_id: int | None = None
    ) -> AccessLogPublic:
        params = {
            k: v
            for k, v in {"limit": limit, "partner_id": partner_id, "after_id": after_id}.items()
            if v is not None
        }
        return _parse(AccessLogPublic, await self._request(_Call("GET", "/v1/access-log", params=params)))

    async def create_partner(self, name: str, *, release_ids: list[int], max_queries: int) -> PartnerCreated:
        body = {"name": name, "release_ids": [int(i) for i in release_ids], "max_queries": int(max_queries)}
        return _parse(
            PartnerCreated, await self._request(_Call("POST", "/v1/partners", json=body, idempotent=False))
        )

    async def create_query(
        self, release_id: int, index: int, idempotency_key: str | None = None
    ) -> QueryPublic:
        """See :meth:`CuratorClient.create_query`."""
        call = self._query_call(release_id, index, idempotency_key)
        return _parse(QueryPublic, await self._request(call))

    async def get_query(self, query_id: int, *, wait: float | None = None) -> QueryPublic:
        return _parse(QueryPublic, await self._request(self._get_query_call(query_id, wait)))

    async def wait_for_query(
        self, query_id: int, *, timeout: float | None = None, poll: float = 30.0
    ) -> QueryPublic:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = poll if deadline is None else max(0.0, min(poll, deadline - time.monotonic()))
            q = await self.get_query(query_id, wait=wait)
            if q.status == "complete":
                return q
            if deadline is not None and time.monotonic() >= deadline:
                raise QueryWaitTimeout(None, f"query {query_id} is still pending", method="GET")

    async def post_result(self, query_id: int, y: float) -> QueryPublic:
        call = _Call("POST", f"/v1/queries/{int(query_id)}/result", json={"y": float(y)}, idempotent=False)
        return _parse(QueryPublic, await self._request(call))

    async def list_queries(self, release_id: int) -> QueriesPublic:
        data = await self._request(_Call("GET", f"/v1/releases/{int(release_id)}/queries"))
        return _parse(QueriesPublic, data)

    async def verify_queries(self, release_id: int) -> QueryLogVerification:
        data = await self._request(_Call("GET", f"/v1/releases/{int(release_id)}/queries/verify"))
        return _parse(QueryLogVerification, data)

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        idempotent = method.upper() == "GET" or "Idempotency-Key" in kwargs.get("headers", {})
        return await self._request(_Call(method.upper(), path, idempotent=idempotent, **kwargs))
