"""The audit chain: canonical JSON of an entry and its hash, and the verification of a whole log.

Each curator query leaves one entry. With ``prev_hash`` the hash of the entry before it (``"0" * 64`` for the
first one)::

    hash = sha256(prev_hash + canonical_json(entry))

``canonical_json`` has sorted keys, no whitespace, UTC timestamps with microseconds, and every float written
as its shortest round-trip ``repr`` (so the bytes are a function of the stored values alone). Editing any
field of an entry changes its hash; deleting or reordering entries breaks the ``seq`` numbering and the
``prev_hash`` links; deleting entries at the end is caught by the study's stored head (count and last hash).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from modeler_service.models import GENESIS_HASH, AuditEntry
from shared.hashchain import canonical, canonical_time
from shared.hashchain import canonical_json as canonical_json_of


def canonical_hyperparameters(hp: dict[str, Any]) -> str:
    """The hyper-parameters as stored in an entry: canonical JSON (floats as repr strings)."""
    return json.dumps(canonical(hp), sort_keys=True, separators=(",", ":"))


def entry_payload(entry: AuditEntry) -> dict[str, Any]:
    """Every field an entry's hash covers (all but ``id``, ``prev_hash`` and ``hash`` themselves)."""
    return {
        "study_id": entry.study_id,
        "seq": int(entry.seq),
        "at": canonical_time(entry.at),
        "iteration": int(entry.iteration),
        "index": int(entry.row_index),
        "y": float(entry.y),
        "source": entry.source,
        "acquisition": float(entry.acquisition),
        "beta": float(entry.beta),
        "mean": float(entry.mean),
        "std": float(entry.std),
        "hyperparameters": entry.hyperparameters,
        "curator_query_id": int(entry.curator_query_id),
    }


def canonical_json(entry: AuditEntry) -> str:
    return canonical_json_of(entry_payload(entry))


def entry_hash(prev_hash: str, entry: AuditEntry) -> str:
    """``sha256(prev_hash + canonical_json(entry))`` as hex."""
    return hashlib.sha256((prev_hash + canonical_json(entry)).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Verification:
    ok: bool
    entries: int
    first_bad_seq: int | None


def verify_chain(
    entries: list[AuditEntry], *, expected_count: int | None = None, expected_head: str | None = None
) -> Verification:
    """Walk the entries in ``seq`` order and report the first position that does not check out.

    Position k (1-based) is bad when the entry there does not carry ``seq == k`` (an entry was deleted or
    renumbered), its ``prev_hash`` is not the previous entry's hash (deleted or reordered), or its ``hash``
    does not match its content (edited). With the study's stored ``expected_count`` / ``expected_head``,
    entries missing at the end are reported as the first missing ``seq``.
    """
    prev = GENESIS_HASH
    for k, entry in enumerate(entries, start=1):
        if entry.seq != k or entry.prev_hash != prev or entry_hash(entry.prev_hash, entry) != entry.hash:
            return Verification(False, len(entries), k)
        prev = entry.hash
    count = len(entries)
    if expected_count is not None and count < expected_count:
        return Verification(False, count, count + 1)
    if (expected_count is not None and count > expected_count) or (
        expected_head is not None and prev != expected_head
    ):
        return Verification(False, count, max(count, 1))
    return Verification(True, count, None)
