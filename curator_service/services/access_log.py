"""The access log: who called what, when, with which status.

``main.AccessLogMiddleware`` writes an entry for every ``/v1`` request in a transaction of its own after
the response. A route whose request ends in a write transaction may put its entry into that transaction
instead (``PendingEntry.add``): the entry reaches the disk with what the request wrote, and the
middleware, seeing it written, skips its own transaction. An answered ``column`` query does this (one
commit, one fsync, instead of two); its ``duration_ms`` then runs to just before that commit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from curator_service import repository as repo
from curator_service.services.auth import Principal


@dataclass
class PendingEntry:
    """The entry of the request in progress (``scope["state"]["access_log"]``, set by the middleware)."""

    method: str
    path: str
    started: float
    #: Set once the entry is committed with the request's own transaction (``add``, then ``committed``).
    written: bool = False
    _added: bool = False

    def fields(self, principal: Principal | None, status_code: int) -> dict[str, Any]:
        """The row's columns (``repo.add_access_log``) for the request as it ends now."""
        return {
            "actor": principal.actor if principal is not None else "anonymous",
            "partner_id": principal.partner_id if principal is not None else None,
            "method": self.method,
            "path": self.path[:500],
            "status_code": status_code,
            "duration_ms": (time.perf_counter() - self.started) * 1000.0,
        }

    def add(self, session: Session, principal: Principal, status_code: int) -> None:
        """Insert the entry in ``session``'s transaction (about to be committed, with this status)."""
        self.add_with(lambda fields: repo.add_access_log(session, **fields), principal, status_code)

    def add_with(
        self, insert: Callable[[dict[str, Any]], None], principal: Principal, status_code: int
    ) -> None:
        """Insert the entry with ``insert(fields)`` in a transaction about to be committed."""
        insert(self.fields(principal, status_code))
        self._added = True

    def committed(self) -> None:
        """The transaction holding the entry committed: the middleware must not write it again."""
        self.written = self._added


def access_log(
    session: Session, *, limit: int, partner_id: int | None, after_id: int | None
) -> Sequence[Any]:
    return repo.list_access_log(session, limit=limit, partner_id=partner_id, after_id=after_id)
