"""Typed HTTP client of the curator API (``API.md``, curator part), sync and async.

This is the only way the modeler service talks to a curator, and what a data scientist imports in a
notebook::

    >>> from shared.client import CuratorClient
    >>> admin = CuratorClient("http://127.0.0.1:8001", token="<admin token>")
    >>> ds = admin.upload_dataset("hospital.csv", name="hospital", objective="outcome")  # doctest: +SKIP
    >>> report = admin.privacy_report(ds.id, epsilon=2.0, delta=1e-4)                     # doctest: +SKIP
    >>> rel = admin.create_release(ds.id, epsilon=2.0, delta=1e-4, r=8)                 # doctest: +SKIP
    >>> partner = admin.create_partner("modeler-lab", release_ids=[rel.id], max_queries=100)  # doctest: +SKIP
    >>> modeler = CuratorClient("http://127.0.0.1:8001", token=partner.token)
    >>> Z = modeler.release_rows(rel.id)             # n x r float64, sha256 verified  # doctest: +SKIP
    >>> q = modeler.create_query(rel.id, index=42)   # doctest: +SKIP
    >>> q.status, q.y                                 # doctest: +SKIP
    ('complete', 0.73)

Behaviour shared by every call:

* **Timeouts**: ``timeout`` seconds per request (connect at most 10 s); long-polls (``get_query(wait=...)``)
  get ``wait`` seconds on top.
* **Retries** (tenacity, exponential backoff with jitter): connection errors, timeouts and 5xx answers are
  retried for requests that are safe to repeat — every ``GET``, and every ``POST`` that carries an
  ``Idempotency-Key`` (``create_query``: the *same* key is re-sent on every attempt, so the curator returns
  the query it already made and never charges it twice). Other ``POST`` calls (upload, release, partner,
  result) are only retried when the connection could not be opened (the request never left).
* **Errors**: any 4xx/5xx answer raises :class:`CuratorError` with ``.status_code`` and the curator's own
  ``.detail`` message; an unreachable curator raises :class:`CuratorUnavailable` (``status_code`` None).
* **TLS**: ``https://`` certificates are always verified, against ``verify`` — a CA bundle path (PEM) or an
  ``ssl.SSLContext`` (``shared.tls.client_ssl_context``) — or the system trust store by default. A
  certificate that does not verify raises :class:`CuratorUnavailable` naming ``CERTIFICATE_VERIFY_FAILED``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import ssl
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

import httpx
import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ValidationError
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from shared.errors import PoboError
from shared.schemas import (
    AccessLogPublic,
    DatasetPublic,
    DatasetsPublic,
    Health,
    LedgerEntryPublic,
    LedgerPublic,
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

__all__ = [
    "AsyncCuratorClient",
    "CuratorClient",
    "CuratorError",
    "CuratorProtocolError",
    "CuratorUnavailable",
    "Ledger",
    "LedgerEntry",
    "QueryWaitTimeout",
    "ReleaseIntegrityError",
    "npy_sha256",
]

M = TypeVar("M", bound=BaseModel)


#: The ledger bodies (``GET /v1/datasets/{id}/ledger``), under their client-side names.
Ledger = LedgerPublic
LedgerEntry = LedgerEntryPublic


#: Answers worth another attempt (the curator or a proxy in front of it is momentarily unwell).
RETRY_STATUSES = frozenset({500, 502, 503, 504})
NPY_MEDIA_TYPE = "application/x-npy"
_CHUNK = 1 << 20


# ------------------------------------------------------------------------------------------------ errors


class CuratorError(PoboError):
    """The curator answered with an error (``status_code`` 4xx/5xx) or could not be reached (None).

    ``detail`` is the curator's own ``{"detail": ...}`` message (validation errors are flattened to one
    readable line), so ``str(err)`` tells the user what the curator objected to.
    """

    def __init__(
        self,
        status_code: int | None,
        detail: str,
        *,
        method: str = "",
        path: str = "",
        retry_after: float | None = None,
    ) -> None:
        self.status_code = status_code
        self.detail = detail
        self.method = method
        self.path = path
        self.retry_after = retry_after  # seconds, from the answer's Retry-After header (None: none sent)
        where = f" {method} {path}" if method else ""
        if status_code is None:
            super().__init__(f"the curator could not be reached{' for' + where if where else ''}: {detail}")
        else:
            super().__init__(f"curator answered {status_code} to{where or ' a request'}: {detail}")


class CuratorUnavailable(CuratorError):
    """The curator could not be reached (connection refused, timeout, broken connection) after retries.

    ``sent`` is False when the connection could not even be opened (the request never left this host).
    """

    def __init__(self, detail: str, *, sent: bool, method: str = "", path: str = "") -> None:
        self.sent = sent
        super().__init__(None, detail, method=method, path=path)


@contextmanager
def _transport_errors(call: _Call) -> Iterator[None]:
    """httpx transport failures -> ``CuratorUnavailable`` (never an httpx exception to our callers)."""
    try:
        yield
    except httpx.TransportError as exc:
        sent = not isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
        raise CuratorUnavailable(
            f"{type(exc).__name__}: {exc or 'connection failed'}",
            sent=sent,
            method=call.method,
            path=call.path,
        ) from exc


class ReleaseIntegrityError(CuratorError):
    """Downloaded release rows do not match the release's published sha256 (or are not an n x r array)."""


class CuratorProtocolError(CuratorError):
    """The server answered, but not as a pobo curator does: a redirect (never followed), a body that is not
    JSON, or JSON of another shape. Usually ``curator_url`` points at another web server."""


def _detail_text(detail: Any) -> str:
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):  # FastAPI/pydantic validation errors
        parts = []
        for item in detail:
            if isinstance(item, dict):
                loc = ".".join(str(x) for x in item.get("loc", ()) if x != "body")
                parts.append(f"{loc}: {item.get('msg', '')}" if loc else str(item.get("msg", "")))
            else:
                parts.append(str(item))
        return "; ".join(parts)
    return json.dumps(detail, sort_keys=True, default=str)


def _error_from(resp: httpx.Response) -> CuratorError:
    """A pobo error answer (JSON with ``detail``) as ``CuratorError``; anything else (an HTML page of a proxy
    or of another web server) as ``CuratorProtocolError``, keeping the status code (a 503 stays a 503)."""
    method, path = resp.request.method, resp.request.url.path
    try:
        body = resp.json()
    except ValueError:
        body = None
    retry_after = _retry_after(resp.headers.get("retry-after"))
    if isinstance(body, dict) and "detail" in body:
        return CuratorError(
            resp.status_code, _detail_text(body["detail"]), method=method, path=path, retry_after=retry_after
        )
    kind = resp.headers.get("content-type", "").split(";")[0].strip() or "a body without a content type"
    return CuratorProtocolError(
        resp.status_code,
        f"{resp.reason_phrase or 'error'}, with {kind} instead of a pobo curator's error body "
        "(is the curator_url the curator service's address, or is a proxy in front of it failing?)",
        method=method,
        path=path,
        retry_after=retry_after,
    )


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (the delay form; an HTTP date counts as "some time", 60 s)."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return 60.0


def npy_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 (hex) of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def _release_model(data: Any) -> ReleaseDetail | ReleasePublic:
    """The admin sees ``ReleaseDetail`` (curator-private diagnostics), a partner ``ReleasePublic``."""
    try:
        return ReleaseDetail.model_validate(data)
    except ValidationError:
        return _parse(ReleasePublic, data)


class QueryWaitTimeout(CuratorError):
    """``wait_for_query`` gave up before the curator's operator posted the outcome."""


# ------------------------------------------------------------------------------------- request plumbing


@dataclass
class _Call:
    """One logical API call: what to send, whether repeating it is safe, how long to wait."""

    method: str
    path: str
    params: dict[str, Any] | None = None
    json: Any = None
    data: dict[str, str] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    upload: Path | None = None  # multipart "file" field, streamed from disk
    idempotent: bool = True
    extra_timeout: float = 0.0


@contextmanager
def _files(call: _Call) -> Iterator[dict[str, Any] | None]:
    """A fresh open file handle per attempt (a retried upload re-reads the file from the start)."""
    if call.upload is None:
        yield None
        return
    with ExitStack() as stack:
        fh: IO[bytes] = stack.enter_context(open(call.upload, "rb"))
        yield {"file": (call.upload.name, fh, "text/csv")}


def _should_retry(call: _Call) -> Callable[[BaseException], bool]:
    def predicate(exc: BaseException) -> bool:
        if isinstance(exc, CuratorUnavailable):
            return call.idempotent or not exc.sent  # never sent: always safe to repeat
        return call.idempotent and isinstance(exc, CuratorError) and exc.status_code in RETRY_STATUSES

    return predicate


def _verify(verify: ssl.SSLContext | str | Path | bool) -> ssl.SSLContext | bool:
    """``verify`` of the clients: an ``ssl.SSLContext``, a CA bundle path (PEM), or True (system trust store).

    ``False`` switches certificate verification off; it is accepted only because it must be asked for
    explicitly (never a default), for a throwaway test setup.
    """
    if isinstance(verify, bool | ssl.SSLContext):
        return verify
    from shared.tls import client_ssl_context

    return client_ssl_context(verify)


class _Base:
    """Configuration and call builders shared by the sync and the async client (no I/O here)."""

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 4,
        backoff: float = 0.2,
        max_backoff: float = 5.0,
    ) -> None:
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.base_url = base_url.rstrip("/")
        self._token = token
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)

    def __repr__(self) -> str:  # never shows the token
        return f"{type(self).__name__}({self.base_url!r})"

    def _headers(self) -> dict[str, str]:
        headers = {"User-Agent": "pobo-client/0.1", "Accept": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    def _timeout(self, extra: float = 0.0) -> httpx.Timeout:
        return httpx.Timeout(self.timeout + extra, connect=min(self.timeout, 10.0))

    def _retry_kwargs(self, call: _Call) -> dict[str, Any]:
        """tenacity settings: exponential backoff with jitter; the last error is re-raised as is."""
        return {
            "retry": retry_if_exception(_should_retry(call)),
            "stop": stop_after_attempt(self.retries + 1),
            "wait": wait_exponential_jitter(
                multiplier=self.backoff, max=self.max_backoff, jitter=self.backoff
            ),
            "reraise": True,
        }

    # -- call builders (one per endpoint; the sync and async methods share them) -------------------------
    @staticmethod
    def _upload_call(
        path: str | os.PathLike[str],
        *,
        name: str,
        features: list[str] | str | None,
        objective: str | None,
        objective_mode: str | None,
        noise_std: float | None,
        scaling: str | dict[str, float] | None,
        epsilon_budget: float | None,
        delta_budget: float | None,
        population: str | None = None,
    ) -> _Call:
        file = Path(path)
        if not file.is_file():
            raise FileNotFoundError(f"no such CSV file: {file}")
        data: dict[str, str] = {"name": name}
        if features is not None:
            data["features"] = features if isinstance(features, str) else ",".join(features)
        optional: dict[str, Any] = {
            "objective": objective,
            "objective_mode": objective_mode,
            "noise_std": noise_std,
            "epsilon_budget": epsilon_budget,
            "delta_budget": delta_budget,
            "population": population,
        }
        data.update({k: str(v) for k, v in optional.items() if v is not None})
        if scaling is not None:
            data["scaling"] = scaling if isinstance(scaling, str) else json.dumps(scaling)
        return _Call("POST", "/v1/datasets", data=data, upload=file, idempotent=False, extra_timeout=600.0)

    @staticmethod
    def _release_call(
        dataset_id: int,
        epsilon: float,
        delta: float,
        r: int | None,
        mechanism: str,
        lift: str | None,
        acknowledge_no_guarantee: bool,
        allow_large_delta: bool,
    ) -> _Call:
        body: dict[str, Any] = {"epsilon": epsilon, "delta": delta, "mechanism": mechanism}
        optional = {
            "r": None if r is None else int(r),
            "lift": lift,
            "acknowledge_no_guarantee": acknowledge_no_guarantee or None,
            "allow_large_delta": allow_large_delta or None,
        }
        body.update({k: v for k, v in optional.items() if v is not None})
        return _Call("POST", f"/v1/datasets/{int(dataset_id)}/releases", json=body, idempotent=False)

    @staticmethod
    def _query_call(release_id: int, index: int, idempotency_key: str | None) -> _Call:
        key = idempotency_key or uuid.uuid4().hex  # generated once: every retry re-sends the same key
        return _Call(
            "POST",
            f"/v1/releases/{int(release_id)}/queries",
            json={"index": int(index)},
            headers={"Idempotency-Key": key},
            idempotent=True,
        )

    @staticmethod
    def _get_query_call(query_id: int, wait: float | None) -> _Call:
        params = {"wait": wait} if wait else None
        return _Call("GET", f"/v1/queries/{int(query_id)}", params=params, extra_timeout=float(wait or 0.0))

    @staticmethod
    def _rows_call(release_id: int) -> _Call:
        return _Call("GET", f"/v1/releases/{int(release_id)}/rows", headers={"Accept": NPY_MEDIA_TYPE})

    @staticmethod
    def _check_rows(
        path: Path, digest: str, expected_sha256: str, release_id: int
    ) -> npt.NDArray[np.float64]:
        if digest != expected_sha256:
            raise ReleaseIntegrityError(
                None,
                f"release {release_id} rows have sha256 {digest}, but the release says {expected_sha256}",
                method="GET",
                path=f"/v1/releases/{release_id}/rows",
            )
        try:
            Z = np.load(path, allow_pickle=False)
        except ValueError as exc:
            raise ReleaseIntegrityError(
                None, f"release {release_id} rows are not a valid .npy file: {exc}"
            ) from exc
        if Z.ndim != 2 or Z.dtype != np.float64:
            raise ReleaseIntegrityError(
                None, f"release {release_id} rows must be a 2-D float64 array, got {Z.dtype} {Z.shape}"
            )
        out: npt.NDArray[np.float64] = Z
        return out


def _decode(resp: httpx.Response) -> Any:
    if resp.status_code >= 400:
        raise _error_from(resp)
    method, path = resp.request.method, resp.request.url.path
    if 300 <= resp.status_code < 400:
        target = resp.headers.get("location", "elsewhere")
        raise CuratorProtocolError(
            resp.status_code,
            f"a redirect to {target[:200]}, which pobo never follows (a curator does not redirect); if you "
            "trust that address, use it as curator_url",
            method=method,
            path=path,
        )
    if resp.status_code == 204 or not resp.content:
        return None
    kind = resp.headers.get("content-type", "").split(";")[0].strip().lower()
    try:
        if kind != "application/json":
            raise ValueError(kind or "no content type")
        return resp.json()
    except ValueError:
        raise CuratorProtocolError(
            resp.status_code,
            f"expected the JSON of a pobo curator, got {kind or 'a body without a content type'}: is the "
            "curator_url the curator service's address?",
            method=method,
            path=path,
        ) from None


def _parse(model: type[M], data: Any) -> M:
    """``data`` as ``model``; a body of another shape is the server's fault, not ours (no 500 for it)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "the body"
        raise CuratorProtocolError(
            None,
            f"expected a pobo curator's {model.__name__}, got JSON of another shape ({where}: "
            f"{first['msg']}): is the curator_url the curator service's address?",
        ) from None


def _fsync_replace(tmp: Path, dest: Path) -> None:
    with open(tmp, "rb+") as fh:
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, dest)
    try:
        dir_fd = os.open(dest.parent, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


# ------------------------------------------------------------------------------------------ sync client


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


# ----------------------------------------------------------------------------------------- async client


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
