"""The access log: who called what, when, with which status (written by ``main.AccessLogMiddleware``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from curator_service import repository as repo


def access_log(
    session: Session, *, limit: int, partner_id: int | None, after_id: int | None
) -> Sequence[Any]:
    return repo.list_access_log(session, limit=limit, partner_id=partner_id, after_id=after_id)
