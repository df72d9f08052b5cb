"""What a call of a pobo API can raise (the curator's and the modeler's), and how an HTTP answer becomes one
of them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

from shared.errors import ERROR_CODE_HEADER, PoboError
from shared.protocol.schemas import (
    LedgerEntryPublic,
    LedgerPublic,
)

#: The ledger bodies (``GET /v1/datasets/{id}/ledger``), under their client-side names.
Ledger = LedgerPublic
LedgerEntry = LedgerEntryPublic


#: Answers worth another attempt (the curator or a proxy in front of it is momentarily unwell).
RETRY_STATUSES = frozenset({500, 502, 503, 504})
NPY_MEDIA_TYPE = "application/x-npy"
_CHUNK = 1 << 20


class ApiError(PoboError):
    """A pobo service answered with an error (``status_code`` 4xx/5xx) or could not be reached (None).

    The base of :class:`CuratorError` (the curator API) and :class:`ModelerApiError` (the modeler API);
    ``service`` names the server in the message. ``detail`` is the server's own ``{"detail": ...}`` message
    (validation errors are flattened to one readable line), so ``str(err)`` tells the user what it objected
    to.
    """

    service = "server"

    def __init__(
        self,
        status_code: int | None,
        detail: str,
        *,
        method: str = "",
        path: str = "",
        retry_after: float | None = None,
        code: str | None = None,
    ) -> None:
        self.status_code = status_code
        self.code = code  # the answer's Pobo-Error-Code header: an error a client may act on by itself
        self.detail = detail
        self.method = method
        self.path = path
        self.retry_after = retry_after  # seconds, from the answer's Retry-After header (None: none sent)
        where = f" {method} {path}" if method else ""
        if status_code is None:
            super().__init__(
                f"the {self.service} could not be reached{' for' + where if where else ''}: {detail}"
            )
        else:
            super().__init__(f"{self.service} answered {status_code} to{where or ' a request'}: {detail}")


class ApiUnavailable(ApiError):
    """The server could not be reached (connection refused, timeout, broken connection) after retries.

    ``sent`` is False when the connection could not even be opened (the request never left this host).
    """

    def __init__(self, detail: str, *, sent: bool, method: str = "", path: str = "") -> None:
        self.sent = sent
        super().__init__(None, detail, method=method, path=path)


class ApiProtocolError(ApiError):
    """The server answered, but not as a pobo service does: a redirect (never followed), a body that is not
    JSON, or JSON of another shape. Usually the URL points at another web server."""


class CuratorError(ApiError):
    """The curator answered with an error (``status_code`` 4xx/5xx) or could not be reached (None).

    ``detail`` is the curator's own ``{"detail": ...}`` message (validation errors are flattened to one
    readable line), so ``str(err)`` tells the user what the curator objected to.
    """

    service = "curator"


class CuratorUnavailable(CuratorError, ApiUnavailable):
    """The curator could not be reached (connection refused, timeout, broken connection) after retries.

    ``sent`` is False when the connection could not even be opened (the request never left this host).
    """


class ReleaseIntegrityError(CuratorError):
    """Downloaded release rows do not match the release's published sha256 (or are not an n x r array)."""


class CuratorProtocolError(CuratorError, ApiProtocolError):
    """The server answered, but not as a pobo curator does: a redirect (never followed), a body that is not
    JSON, or JSON of another shape. Usually ``curator_url`` points at another web server."""


class ModelerApiError(ApiError):
    """The modeler answered with an error (``status_code`` 4xx/5xx) or could not be reached (None); raised
    by :class:`~shared.protocol.client.ModelerClient` (studies) and ``FederationClient`` (agents)."""

    service = "modeler"


class ModelerUnavailable(ModelerApiError, ApiUnavailable):
    """The modeler could not be reached (connection refused, timeout, broken connection) after retries."""


class ModelerProtocolError(ModelerApiError, ApiProtocolError):
    """The server answered, but not as a pobo modeler does (a redirect, a body that is not its JSON).
    Usually ``modeler_url`` points at another web server."""


@dataclass(frozen=True)
class ErrorFamily:
    """What a client raises, and how its messages name the server and the URL the user gave."""

    service: str
    url: str
    error: type[ApiError]
    unavailable: type[ApiUnavailable]
    protocol: type[ApiProtocolError]


CURATOR_ERRORS = ErrorFamily("curator", "curator_url", CuratorError, CuratorUnavailable, CuratorProtocolError)
MODELER_ERRORS = ErrorFamily(
    "modeler", "modeler_url", ModelerApiError, ModelerUnavailable, ModelerProtocolError
)


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


def _error_from(resp: httpx.Response, errors: ErrorFamily = CURATOR_ERRORS) -> ApiError:
    """A pobo error answer (JSON with ``detail``) as the family's error (``CuratorError``); anything else (an
    HTML page of a proxy or of another web server) as its protocol error (``CuratorProtocolError``), keeping
    the status code (a 503 stays a 503)."""
    method, path = resp.request.method, resp.request.url.path
    try:
        body = resp.json()
    except ValueError:
        body = None
    retry_after = _retry_after(resp.headers.get("retry-after"))
    if isinstance(body, dict) and "detail" in body:
        return errors.error(
            resp.status_code,
            _detail_text(body["detail"]),
            method=method,
            path=path,
            retry_after=retry_after,
            code=resp.headers.get(ERROR_CODE_HEADER),
        )
    kind = resp.headers.get("content-type", "").split(";")[0].strip() or "a body without a content type"
    return errors.protocol(
        resp.status_code,
        f"{resp.reason_phrase or 'error'}, with {kind} instead of a pobo {errors.service}'s error body "
        f"(is the {errors.url} the {errors.service} service's address, or is a proxy in front of it "
        "failing?)",
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


class QueryWaitTimeout(CuratorError):
    """``wait_for_query`` gave up before the curator's operator posted the outcome."""
