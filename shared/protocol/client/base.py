"""Request plumbing of the curator client, free of I/O policy: the concrete call, which failures may be
retried, how an answer becomes JSON (or an error), TLS ``verify`` and the checks of downloaded rows."""

from __future__ import annotations

import hashlib
import io
import os
import re
import ssl
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import numpy as np
import numpy.typing as npt

from shared.files import fsync_dir
from shared.protocol.client.errors import (
    _CHUNK,
    CURATOR_ERRORS,
    RETRY_STATUSES,
    ApiError,
    ApiProtocolError,
    ApiUnavailable,
    ErrorFamily,
    ReleaseIntegrityError,
    _error_from,
)


@dataclass(frozen=True)
class Parts:
    """The argument-dependent parts of a request (what an endpoint's request builder makes)."""

    params: dict[str, Any] | None = None
    json: Any = None
    data: dict[str, str] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    upload: Path | None = None  # multipart "file" field, streamed from disk
    extra_timeout: float = 0.0  # seconds on top of the client's timeout (a long-poll, a large upload)


@dataclass(frozen=True)
class _Call:
    """One concrete API call: method, path, what to send, and whether repeating it is safe."""

    method: str
    path: str
    parts: Parts = field(default_factory=Parts)
    idempotent: bool = True


@contextmanager
def _transport_errors(call: _Call, errors: ErrorFamily = CURATOR_ERRORS) -> Iterator[None]:
    """httpx transport failures -> ``CuratorUnavailable`` (the family's; never an httpx exception to our
    callers)."""
    try:
        yield
    except httpx.TransportError as exc:
        sent = not isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
        raise errors.unavailable(
            f"{type(exc).__name__}: {exc or 'connection failed'}",
            sent=sent,
            method=call.method,
            path=call.path,
        ) from exc


@contextmanager
def _files(call: _Call) -> Iterator[dict[str, Any] | None]:
    """A fresh open file handle per attempt (a retried upload re-reads the file from the start)."""
    upload = call.parts.upload
    if upload is None:
        yield None
        return
    with ExitStack() as stack:
        fh: IO[bytes] = stack.enter_context(open(upload, "rb"))
        yield {"file": (upload.name, fh, "text/csv")}


def _should_retry(call: _Call, statuses: frozenset[int] = RETRY_STATUSES) -> Callable[[BaseException], bool]:
    """Transport failures and 5xx answers (``statuses``) of a call that is safe to repeat; a request that
    never left (the connection could not be opened) is always safe."""

    def predicate(exc: BaseException) -> bool:
        if isinstance(exc, ApiUnavailable):
            return call.idempotent or not exc.sent
        return call.idempotent and isinstance(exc, ApiError) and exc.status_code in statuses

    return predicate


def _verify(verify: ssl.SSLContext | str | Path | bool) -> ssl.SSLContext | bool:
    """``verify`` of the client: an ``ssl.SSLContext``, a CA bundle path (PEM), or True (system trust store).

    ``False`` switches certificate verification off; it is accepted only because it must be asked for
    explicitly (never a default), for a throwaway test setup.
    """
    if isinstance(verify, bool | ssl.SSLContext):
        return verify
    from shared.servicekit.tls import client_ssl_context

    return client_ssl_context(verify)


_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class _RangedBody:
    """A download streamed into ``path``, resumable: a partial file left by a dropped connection (or by an
    earlier call) is continued with ``Range: bytes=<size>-`` and ``If-Range: <etag>``, and hashed as it
    grows (the bytes already there are read once, not downloaded again).

    ``headers`` is asked before every attempt; ``write`` takes a 2xx answer: a 206 (its ``Content-Range``
    must start at the partial's end) is appended, any other 2xx (a 200: the ``If-Range`` did not match, or
    the server ignores ranges) rewrites the file from the start. ``resumed`` is True while the file holds
    bytes this download did not receive itself (a partial left by an earlier call, which could be corrupt).
    """

    def __init__(self, path: Path, etag: str, chunk_size: int = _CHUNK) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.path = path
        self.etag = etag
        self.chunk_size = int(chunk_size)
        self.size = 0
        self.resumed = False
        self._hash = hashlib.sha256()
        self._hashed: int | None = None  # bytes of ``path`` that ``_hash`` covers (None: not read yet)

    def _sync(self) -> None:
        """``_hash`` and ``size`` of the file as it is on disk (read again only when it is not what we wrote:
        the first attempt, or a write that failed half way)."""
        try:
            on_disk = self.path.stat().st_size
        except FileNotFoundError:
            on_disk = 0
        if self._hashed == on_disk:
            return
        h, size = hashlib.sha256(), 0
        if on_disk:
            with open(self.path, "rb") as fh:
                for chunk in iter(lambda: fh.read(self.chunk_size), b""):
                    h.update(chunk)
                    size += len(chunk)
        self._hash, self.size, self._hashed = h, size, size
        if size:
            self.resumed = True

    def headers(self) -> dict[str, str]:
        """The request headers of the next attempt (none for an empty partial)."""
        self._sync()
        if not self.size:
            return {}
        return {"Range": f"bytes={self.size}-", "If-Range": self.etag}

    def restart(self) -> None:
        """Throw the partial away: the next attempt downloads the whole body."""
        self.path.unlink(missing_ok=True)
        self._hash, self.size, self._hashed, self.resumed = hashlib.sha256(), 0, 0, False

    def write(self, resp: httpx.Response, errors: ErrorFamily = CURATOR_ERRORS) -> None:
        """Stream a 2xx answer's body into the file (appended for a 206, from the start otherwise)."""
        self._sync()
        if resp.status_code == 206:
            match = _CONTENT_RANGE.fullmatch(resp.headers.get("content-range", "").strip())
            if match is None or int(match.group(1)) != self.size:
                raise _not_pobo(
                    resp,
                    f"a partial answer ({resp.headers.get('content-range', 'no Content-Range')}) that does "
                    f"not continue the {self.size} bytes asked after",
                    errors,
                )
            mode = "ab"
        else:
            self._hash, self.size, self.resumed = hashlib.sha256(), 0, False
            mode = "wb"
        self._hashed = None  # until the body is in: a failure half way is re-read from disk
        with open(self.path, mode) as fh:
            for chunk in resp.iter_bytes(self.chunk_size):
                fh.write(chunk)
                self._hash.update(chunk)
                self.size += len(chunk)
                self._hashed = self.size
        self._hashed = self.size

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def _not_pobo(resp: httpx.Response, message: str, errors: ErrorFamily = CURATOR_ERRORS) -> ApiProtocolError:
    return errors.protocol(resp.status_code, message, method=resp.request.method, path=resp.request.url.path)


def _check_status(resp: httpx.Response, errors: ErrorFamily = CURATOR_ERRORS) -> None:
    """An error answer as ``CuratorError``; a redirect (never followed) as ``CuratorProtocolError`` (the
    family's)."""
    if resp.status_code >= 400:
        raise _error_from(resp, errors)
    if 300 <= resp.status_code < 400:
        target = resp.headers.get("location", "elsewhere")
        raise _not_pobo(
            resp,
            f"a redirect to {target[:200]}, which pobo never follows (a {errors.service} does not redirect); "
            f"if you trust that address, use it as {errors.url}",
            errors,
        )


def _decode(resp: httpx.Response, errors: ErrorFamily = CURATOR_ERRORS) -> Any:
    """The JSON body of a successful pobo answer (None when empty); anything else is an error."""
    _check_status(resp, errors)
    if resp.status_code == 204 or not resp.content:
        return None
    kind = resp.headers.get("content-type", "").split(";")[0].strip().lower()
    try:
        if kind != "application/json":
            raise ValueError(kind or "no content type")
        return resp.json()
    except ValueError:
        raise _not_pobo(
            resp,
            f"expected the JSON of a pobo {errors.service}, got {kind or 'a body without a content type'}: "
            f"is the {errors.url} the {errors.service} service's address?",
            errors,
        ) from None


def _check_rows(
    rows: Path | bytes, digest: str, expected_sha256: str, release_id: int
) -> npt.NDArray[np.float64]:
    """Release rows (a .npy file or its bytes) that match the published sha256 and are n x r float64."""
    path = f"/v1/releases/{release_id}/rows"
    if digest != expected_sha256:
        raise ReleaseIntegrityError(
            None,
            f"release {release_id} rows have sha256 {digest}, but the release says {expected_sha256}",
            method="GET",
            path=path,
        )
    try:
        Z = np.load(io.BytesIO(rows) if isinstance(rows, bytes) else rows, allow_pickle=False)
    except ValueError as exc:
        raise ReleaseIntegrityError(
            None, f"release {release_id} rows are not a valid .npy file: {exc}", method="GET", path=path
        ) from exc
    if Z.ndim != 2 or Z.dtype != np.float64:
        raise ReleaseIntegrityError(
            None,
            f"release {release_id} rows must be a 2-D float64 array, got {Z.dtype} {Z.shape}",
            method="GET",
            path=path,
        )
    out: npt.NDArray[np.float64] = Z
    return out


def _fsync_replace(tmp: Path, dest: Path) -> None:
    """``tmp`` durably renamed to ``dest`` (file and directory fsynced)."""
    with open(tmp, "rb+") as fh:
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, dest)
    fsync_dir(dest.parent)


def npy_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 (hex) of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()
