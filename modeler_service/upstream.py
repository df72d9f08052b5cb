"""The modeler's view of its curators: how a curator client is made (``ClientFactory``) and how a curator's
error becomes the modeler's own (``upstream``). Below ``context`` and the request kinds, which both use it."""

from __future__ import annotations

from collections.abc import Callable

from modeler_service.exceptions import Conflict, NotFound, QuotaExceeded, Unprocessable, UpstreamError
from shared.protocol.client import CuratorClient, CuratorError, CuratorProtocolError

ClientFactory = Callable[[str, str], CuratorClient]


def upstream(exc: CuratorError, what: str) -> Exception:
    """A curator error as the modeler's own: refused token 422, other 4xx pass through, the rest 502 (and
    502 for any answer that is not a pobo curator's, whatever its status)."""
    if isinstance(exc, CuratorProtocolError):
        return UpstreamError(f"{what}: the server at curator_url does not answer like a pobo curator: {exc}")
    if exc.status_code in (401, 403):  # the caller's curator_token is wrong or revoked: a client error
        return Unprocessable(
            f"{what}: the curator refused the study's partner token ({exc.status_code}: {exc.detail}); it "
            "may be mistyped or revoked: ask the curator for a valid partner token (a study keeps the token "
            "it was created with, so create a new study with the new one)"
        )
    if exc.status_code == 404:
        return NotFound(
            f"{what}: not found at the curator ({exc.detail}); it may not exist or may not be granted to "
            "this partner token (any more): ask the curator"
        )
    if exc.status_code == 409:
        return Conflict(f"{what}: {exc.detail}")
    if exc.status_code == 422:
        return Unprocessable(f"{what}: the curator rejected the request ({exc.detail})")
    if exc.status_code == 429 and exc.retry_after is not None:  # a throttle answers with Retry-After
        return QuotaExceeded(
            f"{what}: the curator is throttling requests from this modeler ({exc.detail}); try again in "
            f"{exc.retry_after:.0f} s; if it persists, ask the curator's operator (too many requests or "
            "failed sign-ins from this address?)"
        )
    if exc.status_code == 429:
        return QuotaExceeded(
            f"{what}: the curator's query quota for this partner token is used up ({exc.detail}); ask the "
            "curator for a larger quota, then POST /v1/studies/{id}/run to continue"
        )
    return UpstreamError(f"{what}: {exc}; if this persists, ask the curator's operator to check its log")
