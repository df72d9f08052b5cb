"""The Idempotency-Key of each curator request of a study, built and parsed in one place.

The modeler sends request ``j`` of round ``k`` of study ``s`` with the key::

    "<s>:<k>"        for the first request of a round (j = 0)
    "<s>:<k>.<j>"    for the others (j >= 1)

A repeat of a request (a retry, a restarted runner, a second worker) carries the same key, so the curator
answers with the query it already made and never charges it twice. One-request rounds keep the key the
modeler used before rounds existed (``"<study>:<iteration>"``, the round being the iteration), so an intent
written by an older version is completed with the very key it was first sent with. ``pobo reconcile`` reads
the keys back to find a study's queries in the curator's log.
"""

from __future__ import annotations

__all__ = ["parse_request_key", "request_key"]


def request_key(study_id: str, round_no: int, request: int) -> str:
    """The Idempotency-Key of request ``request`` (0-based) of round ``round_no`` (1-based) of a study."""
    if round_no < 1 or request < 0:
        raise ValueError(f"round must be >= 1 and request >= 0, got {round_no}, {request}")
    return f"{study_id}:{round_no}" if request == 0 else f"{study_id}:{round_no}.{request}"


def parse_request_key(key: str | None, study_id: str) -> tuple[int, int] | None:
    """(round, request) of a key made by :func:`request_key` for ``study_id``; None for any other key."""
    prefix = f"{study_id}:"
    if not key or not key.startswith(prefix):
        return None
    round_part, dot, request_part = key[len(prefix) :].partition(".")
    if not round_part.isdigit() or (dot and not request_part.isdigit()):
        return None
    round_no, request = int(round_part), int(request_part) if dot else 0
    if round_no < 1 or (dot and request < 1):
        return None
    return round_no, request
