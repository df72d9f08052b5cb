"""``pobo reconcile``: compare the modeler's audit log of a study with the curator's query log.

Both logs are hash chains (the modeler's per study, the curator's per release); each side's chain is
verified by its own service, then the entries are matched by curator query id. The study's queries on the
curator are those whose ``Idempotency-Key`` is one the modeler makes for this study
(``shared.protocol.keys.request_key``: round and request), so other studies on the same release do not count
as mismatches. Every difference is listed: a query only one
side knows, a different row index, a different outcome y, a query not complete on the curator.

A DP-GIBO study (``gradient_oracle_id``) is matched against the oracle's answered steps instead: by step
number, comparing theta, the batch of points and the noisy gradient (the curator keeps no hash chain of
steps: each is a unique row per (oracle, step) and per Idempotency-Key, so ``curator_chain_ok`` is true).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from shared.protocol.client import CuratorClient, ModelerClient
from shared.protocol.keys import parse_request_key

__all__ = ["Mismatch", "ReconcileReport", "reconcile"]


@dataclass(frozen=True)
class Mismatch:
    query_id: int | None
    at: str | None  # "round k" or "round k request j"
    kind: str
    curator: str
    modeler: str


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
) -> ReconcileReport:
    """Fetch both logs and both chain verifications and compare them entry by entry."""
    with ModelerClient(modeler_url, modeler_token, verify=verify) as modeler:
        study = modeler.get_study(study_id).model_dump(mode="json")
        audit = [e.model_dump(mode="json") for e in modeler.audit(study_id).entries]
        modeler_verify = modeler.verify_audit(study_id).model_dump(mode="json")
    if study.get("gradient_oracle_id") is not None:
        return _reconcile_gradient(curator_url, curator_token, verify, study, audit, modeler_verify)
    release_id = int(study["release_id"])
    with CuratorClient(curator_url, curator_token, verify=verify) as curator:
        queries = curator.list_queries(release_id).queries
        curator_verify = curator.verify_queries(release_id)
    ours = {q.id: q for q in queries if parse_request_key(q.idempotency_key, study_id) is not None}
    report = ReconcileReport(
        study_id=study_id,
        release_id=release_id,
        modeler_entries=len(audit),
        curator_entries=len(ours),
        modeler_chain_ok=bool(modeler_verify["ok"]),
        curator_chain_ok=curator_verify.ok,
    )
    if not report.modeler_chain_ok:
        report.mismatches.append(
            Mismatch(
                None,
                None,
                "modeler audit chain broken",
                "",
                f"first bad seq {modeler_verify['first_bad_seq']}",
            )
        )
    if not report.curator_chain_ok:
        report.mismatches.append(
            Mismatch(
                None, None, "curator query chain broken", f"first bad seq {curator_verify.first_bad_seq}", ""
            )
        )
    seen: set[int] = set()
    for entry in audit:
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
        elif not _same_y(q.y, float(entry["y"])):
            report.mismatches.append(Mismatch(qid, iteration, "outcome y differs", there, here))
    for qid, q in ours.items():
        if qid not in seen and q.status == "complete":
            parsed = parse_request_key(q.idempotency_key, study_id)
            at = _where(*parsed) if parsed else None
            there = f"index {q.index}, y {q.y!r}, {q.status}"
            report.mismatches.append(Mismatch(qid, at, "only in the curator's log", there, "-"))
    return report


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
        bad = f"first bad seq {modeler_verify['first_bad_seq']}"
        report.mismatches.append(Mismatch(None, None, "modeler audit chain broken", "", bad))
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
