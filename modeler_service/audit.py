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

import json
from typing import Any

from modeler_service.models import AuditEntry
from shared.servicekit.hashchain import (
    ChainLink,
    Verification,
    canonical,
    canonical_time,
    link_hash,
    verify_links,
)
from shared.servicekit.hashchain import canonical_json as canonical_json_of


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
    return link_hash(prev_hash, entry_payload(entry))


def verify_chain(
    entries: list[AuditEntry], *, expected_count: int | None = None, expected_head: str | None = None
) -> Verification:
    """Walk the entries in ``seq`` order and report the first position that does not check out
    (``servicekit.hashchain.verify_links``: renumbered, deleted, reordered, edited or truncated entries)."""
    links = [ChainLink(e.seq, e.prev_hash, e.hash, entry_payload(e)) for e in entries]
    return verify_links(links, expected_count=expected_count, expected_head=expected_head)
