"""Corrections of measured outcomes: the rule for changing a value the lab posted (``manual`` datasets).

A posted value changes in one of two ways, chosen by whether a partner has been sent it (``delivered_at``:
set when a partner first reads the query complete, ``queries.deliver``):

* **correction** (never delivered): the value is *replaced*. The partner only ever sees the new one; no new
  answer left the curator, so nothing more is charged (under output privacy the new value is privatised
  afresh, and the discarded noisy value never leaves the curator).
* **supersession** (delivered): the partner keeps what it was sent and gets a *new* value beside it. It is
  one more answer about the person: under output privacy it is privatised afresh with CTL and charged to
  the person like any answer (``answer_no`` k on the output ledger), and refused with a 409 (nothing
  recorded) when the grant's ``max_epsilon_per_row`` leaves no room; for a raw grant it is one more
  disclosure (unbounded, as the first). The partner sees it in the query's ``corrections``.

Either way nothing is rewritten silently: the query keeps the current value, and each change is a new link
of the release's hash-chained query log holding both values (``querylog.link_corrections``), so the log
verifies before and after. A query's cached repeats (queries answered with its noisy value) change with it,
each with its own link; the change is a supersession for all of them as soon as any of them was delivered.

The new value is answered under the partner's grant as it is now (a grant is only ever tightened: a value
first answered raw is privatised when the grant has output privacy since).

Locks, in the order every other path takes them: the population (output privacy), the query and its
repeats (``FOR UPDATE``: a delivery waits, or is waited for, so "never delivered" holds until the commit),
then the release rows (the chain).
"""

from __future__ import annotations

import math

from sqlalchemy.orm import Session

from curator_service import lab_repository as lab_repo
from curator_service import querylog
from curator_service import repository as repo
from curator_service.exceptions import Conflict, Gone, InvalidInput, NotFound
from curator_service.models import Dataset, Query, QueryCorrection, utcnow
from curator_service.services import outputs

__all__ = ["correct"]

#: Relative slack on the cap, as ``outputs`` allows it.
_CAP_SLACK = 1e-9


def _dataset_of(session: Session, query: Query) -> Dataset:
    release = repo.get_release(session, query.release_id)
    assert release is not None
    dataset = repo.get_dataset(session, release.dataset_id)
    assert dataset is not None
    if dataset.erased_at is not None:
        raise Gone(f"query {query.id} is on release {release.id}, which was erased with its dataset")
    return dataset


def _check_correctable(query: Query | None, query_id: int, dataset: Dataset | None) -> Query:
    if query is None:
        raise NotFound(f"query {query_id} does not exist")
    if query.status != "complete":
        raise Conflict(
            f"query {query_id} is still pending: post its value with POST /v1/queries/{query_id}/result "
            "(a correction changes a value already posted)"
        )
    if query.source_query_id is not None:
        raise Conflict(
            f"query {query_id} repeats query {query.source_query_id}'s row under a grant whose repeats are "
            f"answered from the row's first noisy answer: correct query {query.source_query_id}, and this "
            "query changes with it"
        )
    if dataset is not None and dataset.objective_mode != "manual":
        raise Conflict(
            f"query {query_id} is on a dataset whose outcomes come from its '{dataset.objective}' column; "
            "only measured outcomes (objective_mode 'manual') can be corrected"
        )
    return query


def correct(session: Session, query_id: int, measured: float, reason: str) -> list[QueryCorrection]:
    """Change the measured outcome of a completed ``manual`` query to ``measured`` (the module's rule).

    Returns the corrections recorded: the query's first, then its cached repeats'. Nothing is committed
    here (the request's transaction commits or rolls back the whole change)."""
    if not math.isfinite(measured):
        raise InvalidInput("the corrected value must be a finite number")
    query = _check_correctable(repo.get_query(session, query_id), query_id, None)
    dataset = _dataset_of(session, query)
    _check_correctable(query, query_id, dataset)
    partner = repo.get_partner(session, query.partner_id)
    assert partner is not None
    policy = outputs.policy_of(partner)  # the grant as it is now: a new answer follows its current terms
    if policy is not None:
        repo.lock_population(session, dataset.population_id)
    group = lab_repo.lock_answer_group(session, query_id)  # the query first, then its repeats
    query = _check_correctable(group[0] if group and group[0].id == query_id else None, query_id, dataset)
    complete = [q for q in group if q.status == "complete"]
    kind = "supersession" if lab_repo.first_delivery(complete) is not None else "correction"
    if policy is None:
        answered, raw = float(measured), None
    else:
        answered = float(policy.mechanism.privatise(measured))
        raw = float(measured) if policy.store_raw else None
    charged: float | None = None
    if kind == "supersession":
        charged = _charge_supersession(session, query, dataset, policy)
    now = utcnow()
    corrections: list[QueryCorrection] = []
    for q in complete:
        own = q.id == query.id
        assert q.y is not None  # a complete query has its value
        corrections.append(
            QueryCorrection(
                query_id=q.id,
                release_id=q.release_id,
                partner_id=q.partner_id,
                kind=kind,
                previous_y=float(q.y),
                y=answered,
                previous_y_raw=q.y_raw if own else None,
                y_raw=raw if own else None,
                reason=reason,
                # a repeat shares the query's new answer: cached, free (as its first answer was)
                charged_epsilon=charged if own else (0.0 if kind == "supersession" else None),
                created_at=now,
            )
        )
        lab_repo.set_value(session, q.id, answered, raw if own else None)
    querylog.link_corrections(session, corrections)
    return corrections


def _charge_supersession(
    session: Session, query: Query, dataset: Dataset, policy: outputs.OutputPolicy | None
) -> float | None:
    """Charge a superseding answer to its person (the grant's cap first); its epsilon (None: raw)."""
    epsilon = None if policy is None else policy.charged_epsilon
    cap = None if policy is None else policy.max_epsilon_per_row
    if policy is not None and cap is not None:
        spent = outputs.person_bound(session, dataset, query.row_index, query.partner_id)
        if spent + policy.charged_epsilon > cap * (1 + _CAP_SLACK):
            raise Conflict(
                f"query {query.id}'s value was sent to its partner already, so a new value is one more "
                f"answer about the person in row {query.row_index}, and this grant's output allotment for "
                f"them is used up: max_epsilon_per_row = {cap:g}, spent up to {spent:.6g}, one more answer "
                f"costs {policy.charged_epsilon:.6g}. Nothing was recorded and the partner keeps the value "
                "it has; tell the partner out of band, or answer the new measurement under a new grant."
            )
    outputs.charge(
        session, dataset, query, epsilon, answer_no=lab_repo.supersessions_charged(session, query.id) + 1
    )
    return epsilon
