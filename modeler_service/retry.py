"""When a running study waits for its curator, and for how long.

A background run meets two kinds of curator failures:

* **transient**, worth waiting for: the curator cannot be reached (connection refused, timeouts, a broken
  connection), or it (or a proxy in front of it) answers 502, 503 or 504, or 429 with ``Retry-After`` (its
  failed-token throttle). The study shows ``waiting_for_curator``, the last error and the time of the next
  attempt, and the runner tries again by itself: after ``base`` seconds, then twice as long each time up to
  ``cap``, with "equal jitter" (half the delay fixed, half uniformly random; Brooker, "Exponential backoff
  and jitter", AWS 2015) so that many studies do not hammer a curator that comes back all at once. The
  iteration is retried with its write-ahead intent and its Idempotency-Key, so the curator never charges it
  twice.
* **permanent**: everything else (the partner token refused, the release gone, the quota used up, an
  answer that is not a curator's). The study fails with a message that says what to do.
"""

from __future__ import annotations

import secrets

from shared.protocol.client import CuratorError, CuratorUnavailable

__all__ = ["TRANSIENT_STATUSES", "curator_cause", "delay_seconds", "is_transient"]

#: Curator (or proxy) answers that say "not now" rather than "no".
TRANSIENT_STATUSES = frozenset({502, 503, 504})
_RANDOM = secrets.SystemRandom()


def curator_cause(exc: BaseException) -> CuratorError | None:
    """The curator error behind ``exc`` (itself, or what the modeler's error was raised from)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, CuratorError):
            return seen
        seen = seen.__cause__
    return None


def is_transient(exc: CuratorError) -> bool:
    if isinstance(exc, CuratorUnavailable):
        return True
    if exc.status_code in TRANSIENT_STATUSES:
        return True
    return exc.status_code == 429 and exc.retry_after is not None


def delay_seconds(attempt: int, *, base: float, cap: float, retry_after: float | None = None) -> float:
    """The wait before attempt ``attempt + 1`` (``attempt`` >= 1 failures so far), never below the
    curator's own ``Retry-After``."""
    ceiling = min(cap, base * 2.0 ** min(attempt - 1, 60))
    wait = ceiling / 2 + _RANDOM.uniform(0.0, ceiling / 2)
    return max(wait, retry_after or 0.0)
