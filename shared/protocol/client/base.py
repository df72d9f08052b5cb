"""Request plumbing shared by the sync and the async client: calls, retries, decoding, parsing."""

from __future__ import annotations

import hashlib
import json
import os
import ssl
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
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from shared.protocol.client.errors import (
    _CHUNK,
    NPY_MEDIA_TYPE,
    RETRY_STATUSES,
    CuratorError,
    CuratorProtocolError,
    CuratorUnavailable,
    ReleaseIntegrityError,
    _error_from,
)
from shared.protocol.schemas import (
    ReleaseDetail,
    ReleasePublic,
)

M = TypeVar("M", bound=BaseModel)


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
    from shared.servicekit.tls import client_ssl_context

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
