"""The audit chain: the payload of an entry and its hash, and the verification of a whole log.

Each curator request of a round leaves one entry. With ``prev_hash`` the hash of the entry before it
(``"0" * 64`` for the first one)::

    hash = sha256(prev_hash + canonical_json(payload(entry)))

``canonical_json`` (``shared.servicekit.hashchain``) has sorted keys, no whitespace, UTC timestamps with
microseconds and every float as its shortest round-trip ``repr``, so the bytes are a function of the stored
values alone. Editing any field changes the hash; deleting or reordering entries breaks the ``seq``
numbering and the ``prev_hash`` links; deleting entries at the end is caught by the study's stored head.

The payload is versioned by ``hash_version``:

* 2 (current): study, seq, time, round, request, kind, row index, y, the strategy's ``details`` object and
  the curator query id.
* 1: entries written before rounds existed, one GP-UCB row per iteration. Their numbers now live in
  ``details``, and the payload is rebuilt in the old layout (iteration = seq; source, acquisition, beta,
  mean, std and the hyper-parameters as canonical JSON text), so chains written then still verify.

A study's supersessions (values the curator superseded after the study had been sent them,
``modeler_service.supersessions``) are a second chain of the same construction, numbered 1, 2, ... on their
own, with its length and head stored on the study (``supersessions_done``, ``supersessions_head``); the
payload of a supersession is ``supersession_payload``.
"""

from __future__ import annotations

import json
from typing import Any

from modeler_service.models import AuditEntry, AuditSupersession
from shared.servicekit.hashchain import (
    ChainLink,
    Verification,
    canonical,
    canonical_time,
    link_hash,
    verify_links,
)

HASH_VERSION = 2


def _legacy_payload(entry: AuditEntry) -> dict[str, Any]:
    d = entry.details
    hyperparameters = json.dumps(canonical(d["hyperparameters"]), sort_keys=True, separators=(",", ":"))
    return {
        "study_id": entry.study_id,
        "seq": int(entry.seq),
        "at": canonical_time(entry.at),
        "iteration": int(entry.seq),
        "index": int(entry.row_index),  # type: ignore[arg-type]
        "y": float(entry.y),  # type: ignore[arg-type]
        "source": d["source"],
        "acquisition": float(d["acquisition"]),
        "beta": float(d["beta"]),
        "mean": float(d["mean"]),
        "std": float(d["std"]),
        "hyperparameters": hyperparameters,
        "curator_query_id": int(entry.curator_query_id),
    }


def entry_payload(entry: AuditEntry) -> dict[str, Any]:
    """Every field an entry's hash covers (all but ``id``, ``prev_hash`` and ``hash`` themselves)."""
    if entry.hash_version == 1:
        return _legacy_payload(entry)
    return {
        "v": int(entry.hash_version),
        "study_id": entry.study_id,
        "seq": int(entry.seq),
        "at": canonical_time(entry.at),
        "round": int(entry.round),
        "request": int(entry.request),
        "kind": entry.kind,
        "index": None if entry.row_index is None else int(entry.row_index),
        "y": None if entry.y is None else float(entry.y),
        "details": entry.details,
        "curator_query_id": int(entry.curator_query_id),
    }


def entry_hash(prev_hash: str, entry: AuditEntry) -> str:
    """``sha256(prev_hash + canonical_json(payload))`` as hex."""
    return link_hash(prev_hash, entry_payload(entry))


def verify_chain(
    entries: list[AuditEntry], *, expected_count: int | None = None, expected_head: str | None = None
) -> Verification:
    """Walk the entries in ``seq`` order and report the first position that does not check out
    (``shared.servicekit.hashchain.verify_links``: renumbered, deleted, reordered, edited or truncated)."""
    links = [ChainLink(e.seq, e.prev_hash, e.hash, entry_payload(e)) for e in entries]
    return verify_links(links, expected_count=expected_count, expected_head=expected_head)


def supersession_payload(record: AuditSupersession) -> dict[str, Any]:
    """Every field a supersession's hash covers (all but ``id``, ``prev_hash`` and ``hash``)."""
    return {
        "v": 1,
        "study_id": record.study_id,
        "seq": int(record.seq),
        "at": canonical_time(record.at),
        "correction_id": int(record.correction_id),
        "curator_query_id": int(record.curator_query_id),
        "audit_seq": int(record.audit_seq),
        "previous_y": float(record.previous_y),
        "y": float(record.y),
        "curator_at": canonical_time(record.curator_at),
    }


def supersession_hash(prev_hash: str, record: AuditSupersession) -> str:
    """``sha256(prev_hash + canonical_json(supersession_payload))`` as hex."""
    return link_hash(prev_hash, supersession_payload(record))


def verify_supersessions(
    records: list[AuditSupersession], *, expected_count: int, expected_head: str
) -> Verification:
    """The supersession chain walked as ``verify_chain`` walks the entries' (against the study's stored
    length and head)."""
    links = [ChainLink(r.seq, r.prev_hash, r.hash, supersession_payload(r)) for r in records]
    return verify_links(links, expected_count=expected_count, expected_head=expected_head)
