"""A study's results: the audit log (JSON, CSV, verification) and the progress plot (by default the best
value so far per query; a request kind may draw its own, e.g. the path of theta of a gradient-oracle
study)."""

from __future__ import annotations

import csv
import io
import json
import threading
from collections import OrderedDict
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from modeler_service import repository as repo
from modeler_service.audit import verify_chain, verify_supersessions
from modeler_service.kinds import kind_of
from modeler_service.models import AuditEntry
from modeler_service.rounds import v1_numbers
from modeler_service.schemas import (
    AuditEntryPublic,
    AuditLog,
    AuditVerification,
)
from modeler_service.service import get_study
from modeler_service.supersessions import supersessions_public

#: Rendered plots kept per process, keyed by what they show (``_plot_key``); the oldest is dropped first.
PLOT_CACHE_SIZE = 64
_plots: OrderedDict[tuple[Any, ...], bytes] = OrderedDict()
_plots_lock = threading.Lock()

#: Audit entry columns published under their own names.
_ENTRY_FIELDS = (
    "seq",
    "at",
    "round",
    "request",
    "kind",
    "y",
    "curator_query_id",
    "hash_version",
    "prev_hash",
    "hash",
)


def _entry_public(e: AuditEntry) -> AuditEntryPublic:
    details = dict(e.details or {})
    return AuditEntryPublic.model_validate(
        {
            **{key: getattr(e, key) for key in _ENTRY_FIELDS},
            "iteration": e.seq,
            "index": e.row_index,
            "details": details,
            **v1_numbers(details),
        }
    )


def audit_log(session: Session, study_id: str) -> AuditLog:
    """The entries (each with the value it was sent) and the supersessions of their values."""
    get_study(session, study_id)
    entries = [_entry_public(e) for e in repo.audit_entries(session, study_id)]
    superseded = supersessions_public(session, study_id)
    return AuditLog(entries=entries, count=len(entries), supersessions=superseded)


AUDIT_CSV_COLUMNS = [
    "seq",
    "at",
    "round",
    "request",
    "kind",
    "index",
    "y",
    "details",
    "curator_query_id",
    "hash_version",
    "prev_hash",
    "hash",
]


def audit_csv(session: Session, study_id: str) -> str:
    """The audit log's entries as CSV: floats in full precision, ``details`` as JSON with sorted keys (one
    column). One row per entry with the value it was sent; the supersessions of those values are in the
    JSON form (``supersessions``), so the columns keep one meaning."""
    get_study(session, study_id)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(AUDIT_CSV_COLUMNS)
    for e in repo.audit_entries(session, study_id):
        writer.writerow(
            [
                e.seq,
                e.at.isoformat(),
                e.round,
                e.request,
                e.kind,
                "" if e.row_index is None else e.row_index,
                "" if e.y is None else repr(e.y),
                json.dumps(e.details or {}, sort_keys=True, separators=(",", ":")),
                e.curator_query_id,
                e.hash_version,
                e.prev_hash,
                e.hash,
            ]
        )
    return buf.getvalue()


def verify_audit(session: Session, study_id: str) -> AuditVerification:
    """Both chains of the study's audit log, each against its stored length and head."""
    study = get_study(session, study_id)
    result = verify_chain(
        repo.audit_entries(session, study_id),
        expected_count=study.iterations_done,
        expected_head=study.audit_head,
    )
    superseded = verify_supersessions(
        repo.supersessions(session, study_id),
        expected_count=study.supersessions_done,
        expected_head=study.supersessions_head,
    )
    return AuditVerification(
        ok=result.ok and superseded.ok,
        entries=result.entries,
        first_bad_seq=result.first_bad_seq,
        supersessions=superseded.entries,
        first_bad_supersession_seq=superseded.first_bad_seq,
    )


def plot_png(session: Session, study_id: str) -> bytes:
    """Best value so far vs iteration (and every observed y), as PNG (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")

    study = get_study(session, study_id)
    # Everything drawn comes from the audit entries, which the head hash of their chain pins down (a new
    # round moves it), and from the study's fixed fields: a repeat request is served the same bytes.
    key = (
        study.id,
        study.audit_head,
        study.iterations_done,
        study.strategy,
        study.release_id,
        study.gradient_oracle_id,
        study.n,
        study.r,
    )
    with _plots_lock:
        png = _plots.get(key)
        if png is not None:
            _plots.move_to_end(key)
            return png
    png = _render(session, study)
    with _plots_lock:
        _plots[key] = png
        while len(_plots) > PLOT_CACHE_SIZE:
            _plots.popitem(last=False)
    return png


def _render(session: Session, study: Any) -> bytes:
    from matplotlib.figure import Figure

    study_id = study.id
    fig = Figure(figsize=(6.4, 4.0), dpi=100)
    ax = fig.add_subplot()
    if kind_of(study).plot(ax, session, study):
        return _png(fig)
    y = np.array(repo.outcomes(session, study_id), dtype=np.float64)
    it = np.arange(1, y.size + 1)
    if y.size:
        ax.plot(it, np.maximum.accumulate(y), drawstyle="steps-post", lw=2, label="best so far")
        ax.scatter(it, y, s=12, alpha=0.5, color="grey", label="observed y")
        ax.legend(loc="lower right")
    else:
        ax.text(0.5, 0.5, "no observations yet", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("query")
    ax.set_ylabel("y")
    target = kind_of(study).target_label(study)
    ax.set_title(f"study {study.id[:8]}: {study.strategy} on {target} (n={study.n}, r={study.r})")
    ax.grid(alpha=0.3)
    return _png(fig)


def _png(fig: Any) -> bytes:
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()
