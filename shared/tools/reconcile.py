"""``pobo reconcile``: compare the modeler's audit log of a study with the curator's query log.

Both logs are hash chains (the modeler's per study, the curator's per release); each side's chain is
verified by its own service, then the entries are matched by curator query id. The study's queries on the
curator are those whose ``Idempotency-Key`` is one the modeler makes for this study
(``shared.protocol.keys.request_key``: round and request), so other studies on the same release do not count
as mismatches. Every difference is listed: a query only one
side knows, a different row index, a different outcome y, a query not complete on the curator.

A measured outcome the curator's lab changed after the partner had been sent it is a *supersession*
(``POST /v1/queries/{id}/corrections``): the curator's query then carries the new value and lists the change
in its ``corrections``. The modeler records it in its audit log's ``supersessions`` (``GET
/v1/studies/{id}/audit``: the curator's ``correction_id``, the ``curator_query_id``, ``previous_y`` and
``y``; the entry keeps the value it was sent). A record of the same shape in an audit entry's ``details``
(``{"supersession": {...}}``) is read too. Such a query reconciles when the modeler's answer entry holds the
value it was sent (before the supersessions, or the value of the one after which it first read the query)
and every later supersession is recorded by the modeler with the same id and values; it is then listed as a
supersession, not a mismatch; one the modeler has not recorded is a mismatch. ``reconcile`` first asks the
modeler to record what it lacks (``POST /v1/studies/{id}/audit/sync``) unless ``sync=False``. A value
corrected before any partner was sent it was never seen by the modeler: the answer entry holds the
corrected value, as the curator's query does.

A DP-GIBO study (``gradient_oracle_id``) is matched against the oracle's answered steps instead: by step
number, comparing theta, the batch of points and the noisy gradient (the curator keeps no hash chain of
steps: each is a unique row per (oracle, step) and per Idempotency-Key, so ``curator_chain_ok`` is true).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.protocol.client import CuratorClient, ModelerClient
from shared.protocol.keys import parse_request_key
from shared.protocol.schemas import QueryLogVerification, QueryPublic

__all__ = ["Mismatch", "ReconcileReport", "Supersession", "compare_release_logs", "reconcile"]

#: The key of a supersession record in a modeler audit entry's ``details``.
SUPERSESSION = "supersession"


@dataclass(frozen=True)
class Mismatch:
    query_id: int | None
    at: str | None  # "round k" or "round k request j"
    kind: str
    curator: str
    modeler: str


@dataclass(frozen=True)
class Supersession:
    """A value the partner had been sent, then superseded by the curator, recorded on both sides."""

    query_id: int
    correction_id: int
    previous_y: float
    y: float


@dataclass
class ReconcileReport:
    study_id: str
    release_id: int | None
    modeler_entries: int
    curator_entries: int
    modeler_chain_ok: bool
    curator_chain_ok: bool
    mismatches: list[Mismatch] = field(default_factory=list)
    gradient_oracle_id: int | None = None
    supersessions: list[Supersession] = field(default_factory=list)

    @property
    def source(self) -> str:
        """What the study ran on, for messages ("release 3", "gradient oracle 2")."""
        if self.gradient_oracle_id is not None:
            return f"gradient oracle {self.gradient_oracle_id}"
        return f"release {self.release_id}"

    @property
    def ok(self) -> bool:
        return self.modeler_chain_ok and self.curator_chain_ok and not self.mismatches


def _same_y(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return a == b or math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)


def reconcile(
    *,
    curator_url: str,
    curator_token: str,
    modeler_url: str,
    modeler_token: str,
    study_id: str,
    verify: Any = True,
    sync: bool = True,
) -> ReconcileReport:
    """Fetch both logs and both chain verifications and compare them entry by entry. ``sync``: first have
    the modeler record the curator's supersessions it lacks, so that the comparison is current."""
    with ModelerClient(modeler_url, modeler_token, verify=verify) as modeler:
        study = modeler.get_study(study_id).model_dump(mode="json")
        if sync and study.get("release_id") is not None:
            modeler.sync_audit(study_id)
        log = modeler.audit(study_id)
        audit = [e.model_dump(mode="json") for e in log.entries]
        superseded = [s.model_dump(mode="json") for s in log.supersessions]
        modeler_verify = modeler.verify_audit(study_id).model_dump(mode="json")
    if study.get("gradient_oracle_id") is not None:
        return _reconcile_gradient(curator_url, curator_token, verify, study, audit, modeler_verify)
    release_id = int(study["release_id"])
    with CuratorClient(curator_url, curator_token, verify=verify) as curator:
        queries = curator.list_queries(release_id).queries
        curator_verify = curator.verify_queries(release_id)
    return compare_release_logs(
        study_id, release_id, audit, modeler_verify, queries, curator_verify, supersessions=superseded
    )


def compare_release_logs(
    study_id: str,
    release_id: int,
    audit: Sequence[dict[str, Any]],
    modeler_verify: dict[str, Any],
    queries: Sequence[QueryPublic],
    curator_verify: QueryLogVerification,
    *,
    supersessions: Sequence[dict[str, Any]] = (),
) -> ReconcileReport:
    """Compare a study's audit entries (as JSON) with its release's queries on the curator (the study's own:
    by their Idempotency-Keys) and both chains' verifications. ``supersessions``: the audit log's
    ``supersessions`` (as JSON: ``correction_id``, ``curator_query_id``, ``previous_y``, ``y``)."""
    ours = {q.id: q for q in queries if parse_request_key(q.idempotency_key, study_id) is not None}
    answers = [e for e in audit if not (e.get("details") or {}).get(SUPERSESSION)]
    recorded: dict[int, list[dict[str, Any]]] = {}
    for e in audit:
        record = (e.get("details") or {}).get(SUPERSESSION)
        if record:
            recorded.setdefault(int(e["curator_query_id"]), []).append(dict(record))
    for s in supersessions:
        recorded.setdefault(int(s["curator_query_id"]), []).append(dict(s))
    report = ReconcileReport(
        study_id=study_id,
        release_id=release_id,
        modeler_entries=len(answers),
        curator_entries=len(ours),
        modeler_chain_ok=bool(modeler_verify["ok"]),
        curator_chain_ok=curator_verify.ok,
    )
    if not report.modeler_chain_ok:
        report.mismatches.append(
            Mismatch(None, None, "modeler audit chain broken", "", _first_bad(modeler_verify))
        )
    if not report.curator_chain_ok:
        report.mismatches.append(
            Mismatch(
                None, None, "curator query chain broken", f"first bad seq {curator_verify.first_bad_seq}", ""
            )
        )
    seen: set[int] = set()
    for entry in answers:
        qid = int(entry["curator_query_id"])
        iteration = _where(int(entry.get("round", entry["iteration"])), int(entry.get("request", 0)))
        seen.add(qid)
        q = ours.get(qid)
        here = f"index {entry['index']}, y {entry['y']!r}"
        if q is None:
            report.mismatches.append(Mismatch(qid, iteration, "only in the modeler's audit", "-", here))
            continue
        there = f"index {q.index}, y {q.y!r}, {q.status}"
        if q.status != "complete":
            report.mismatches.append(Mismatch(qid, iteration, "not complete at the curator", there, here))
        elif q.index != int(entry["index"]):
            report.mismatches.append(Mismatch(qid, iteration, "row index differs", there, here))
        else:
            _compare_value(report, q, float(entry["y"]), recorded.pop(qid, []), iteration, here)
    for qid, records in recorded.items():
        for record in records:
            here = f"supersession {record.get('correction_id')}: y {record.get('y')!r}"
            report.mismatches.append(
                Mismatch(qid, None, "supersession only in the modeler's audit", "-", here)
            )
    for qid, q in ours.items():
        if qid not in seen and q.status == "complete":
            parsed = parse_request_key(q.idempotency_key, study_id)
            at = _where(*parsed) if parsed else None
            there = f"index {q.index}, y {q.y!r}, {q.status}"
            report.mismatches.append(Mismatch(qid, at, "only in the curator's log", there, "-"))
    return report


def _compare_value(
    report: ReconcileReport,
    q: QueryPublic,
    y: float,
    records: list[dict[str, Any]],
    at: str,
    here: str,
) -> None:
    """The modeler's answer ``y`` and supersession ``records`` of query ``q`` against its values at the
    curator: the one first sent, then each supersession's."""
    superseded = [c for c in q.corrections if c.kind == "supersession"]
    values = [superseded[0].previous_y if superseded else q.y] + [c.y for c in superseded]
    first = next((k for k, v in enumerate(values) if _same_y(v, y)), None)
    if first is None:
        sent = ", then ".join(repr(v) for v in values)
        report.mismatches.append(Mismatch(q.id, at, "outcome y differs", f"y {sent}, {q.status}", here))
        return
    by_id = {int(r.get("correction_id", -1)): r for r in records}
    for c in superseded[first:]:
        record = by_id.pop(c.id, None)
        there = f"supersession {c.id}: y {c.previous_y!r} -> {c.y!r}"
        if record is None:
            report.mismatches.append(
                Mismatch(q.id, at, "supersession not in the modeler's audit", there, here)
            )
        elif not (
            _same_y(c.previous_y, _float(record.get("previous_y"))) and _same_y(c.y, _float(record.get("y")))
        ):
            theirs = f"supersession {c.id}: y {record.get('previous_y')!r} -> {record.get('y')!r}"
            report.mismatches.append(Mismatch(q.id, at, "supersession values differ", there, theirs))
        else:
            report.supersessions.append(Supersession(q.id, c.id, c.previous_y, c.y))
    for cid, record in by_id.items():
        theirs = f"supersession {cid}: y {record.get('y')!r}"
        report.mismatches.append(Mismatch(q.id, at, "supersession only in the modeler's audit", "-", theirs))


def _first_bad(verification: dict[str, Any]) -> str:
    """Where the modeler's verification found its chains broken (entries, supersessions)."""
    found = []
    if verification.get("first_bad_seq") is not None:
        found.append(f"first bad seq {verification['first_bad_seq']}")
    if verification.get("first_bad_supersession_seq") is not None:
        found.append(f"first bad supersession seq {verification['first_bad_supersession_seq']}")
    return ", ".join(found) or "first bad seq None"


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _reconcile_gradient(
    curator_url: str,
    curator_token: str,
    verify: Any,
    study: dict[str, Any],
    audit: list[dict[str, Any]],
    modeler_verify: dict[str, Any],
) -> ReconcileReport:
    study_id = str(study["id"])
    oracle_id = int(study["gradient_oracle_id"])
    with CuratorClient(curator_url, curator_token, verify=verify) as curator:
        steps = curator.list_gradient_steps(oracle_id).data
    ours = {s.step: s for s in steps if parse_request_key(s.idempotency_key, study_id) is not None}
    report = ReconcileReport(
        study_id=study_id,
        release_id=None,
        gradient_oracle_id=oracle_id,
        modeler_entries=len(audit),
        curator_entries=len(ours),
        modeler_chain_ok=bool(modeler_verify["ok"]),
        curator_chain_ok=True,
    )
    if not report.modeler_chain_ok:
        report.mismatches.append(
            Mismatch(None, None, "modeler audit chain broken", "", _first_bad(modeler_verify))
        )
    seen: set[int] = set()
    for entry in audit:
        number = int(entry["curator_query_id"])
        at = _where(int(entry["round"]), int(entry["request"]))
        seen.add(number)
        details = entry.get("details") or {}
        step = ours.get(number)
        here = f"step {number}, gradient {details.get('gradient')!r}"
        if step is None:
            report.mismatches.append(Mismatch(number, at, "only in the modeler's audit", "-", here))
            continue
        there = f"step {step.step}, gradient {step.gradient!r}"
        if list(step.gradient) != list(details.get("gradient") or []):
            report.mismatches.append(Mismatch(number, at, "gradient differs", there, here))
        elif list(step.theta) != list(details.get("theta") or []) or [list(p) for p in step.points] != [
            list(p) for p in details.get("points") or []
        ]:
            report.mismatches.append(Mismatch(number, at, "step inputs differ", there, here))
    for number, step in ours.items():
        if number not in seen:
            parsed = parse_request_key(step.idempotency_key, study_id)
            where = _where(*parsed) if parsed else None
            there = f"step {step.step}, gradient {step.gradient!r}"
            report.mismatches.append(Mismatch(number, where, "only in the curator's log", there, "-"))
    return report


def _where(round_no: int, request: int) -> str:
    return f"round {round_no}" if request == 0 else f"round {round_no} request {request}"
