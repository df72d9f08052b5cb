"""Hash chains for tamper-evident logs (the modeler's audit log, the curator's query log).

Entry k carries ``prev_hash`` (the hash of entry k-1, :data:`GENESIS_HASH` for the first) and::

    hash = sha256(prev_hash + canonical_json(payload))

``canonical_json`` has sorted keys, no whitespace, UTC timestamps with microseconds and every float written
as its shortest round-trip ``repr``, so the bytes are a function of the stored values alone. Editing an entry
changes its hash; deleting or reordering entries breaks the ``seq`` numbering and the links; deleting
entries at the end is caught by comparing with a separately stored head (count and last hash).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

GENESIS_HASH = "0" * 64

__all__ = [
    "GENESIS_HASH",
    "ChainLink",
    "Verification",
    "canonical",
    "canonical_float",
    "canonical_json",
    "canonical_time",
    "link_hash",
    "verify_links",
]


def canonical_float(value: float) -> str:
    """Fixed textual form of a float: Python's shortest round-trip repr ('nan'/'inf' spelled out)."""
    value = float(value)
    if math.isnan(value):
        return "nan"
    return repr(value)


def canonical_time(value: datetime) -> str:
    """UTC with microseconds; a naive value (SQLite returns those) is taken to be UTC."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def canonical(value: Any) -> Any:
    """A JSON-ready copy of ``value`` with floats and datetimes in their canonical text forms."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return canonical_float(value)
    if isinstance(value, datetime):
        return canonical_time(value)
    if isinstance(value, dict):
        return {str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    raise TypeError(f"cannot canonicalise {type(value).__name__}")


def canonical_json(payload: dict[str, Any]) -> str:
    return json.dumps(canonical(payload), sort_keys=True, separators=(",", ":"))


def link_hash(prev_hash: str, payload: dict[str, Any]) -> str:
    """``sha256(prev_hash + canonical_json(payload))`` as hex."""
    return hashlib.sha256((prev_hash + canonical_json(payload)).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ChainLink:
    """One stored entry as the verifier sees it."""

    seq: int | None
    prev_hash: str | None
    hash: str | None
    payload: dict[str, Any]


@dataclass(frozen=True)
class Verification:
    ok: bool
    entries: int
    first_bad_seq: int | None


def verify_links(
    links: Sequence[ChainLink], *, expected_count: int | None = None, expected_head: str | None = None
) -> Verification:
    """Walk the links in order and report the first position (1-based) that does not check out.

    Position k is bad when its entry does not carry ``seq == k`` (deleted or renumbered), its ``prev_hash``
    is not the previous entry's hash (deleted or reordered), or its ``hash`` does not match its content
    (edited). With a stored ``expected_count`` / ``expected_head``, entries missing at the end are reported
    as the first missing ``seq``.
    """
    prev = GENESIS_HASH
    for k, link in enumerate(links, start=1):
        if link.seq != k or link.prev_hash != prev or link.hash != link_hash(prev, link.payload):
            return Verification(False, len(links), k)
        prev = link.hash
    count = len(links)
    if expected_count is not None and count < expected_count:
        return Verification(False, count, count + 1)
    if (expected_count is not None and count > expected_count) or (
        expected_head is not None and prev != expected_head
    ):
        return Verification(False, count, max(count, 1))
    return Verification(True, count, None)
