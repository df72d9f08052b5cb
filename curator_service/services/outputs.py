"""Output privacy: CTL(epsilon) on a partner's answers, and the per-person output ledger of a population.

LDP-BO (Zhou & Tan, AAAI 2021), mechanism CTL and Lemma 1: an outcome clipped to ``[-(B + R), B + R]`` plus
Laplace noise of scale ``2 (B + R) / epsilon`` is epsilon-DP for the person it is about
(``shared.privacy.ctl``). What this module adds is the bookkeeping that keeps that guarantee true over many
answers:

* **Every answer about a person is charged to that person**: an ``OutputCharge`` per answer (dataset, row,
  partner). Rows are not matched across datasets, so the bound on one person's total is their row's total in
  this dataset plus, for every other dataset of the population, that dataset's largest row total; a dataset
  that declares ``rows_per_person = k`` counts k rows per person (group privacy: the k largest totals are
  bounded by k times the largest).
* **Each grant has its own allotment.** A partner's cache and cap concern its own answers only: a repeated
  query of a row returns *that partner's* first noisy answer (cached, free), and a grant with
  ``max_epsilon_per_row`` (its per-person allotment) refuses a query (409, nothing charged) when the bound on
  what *it* has spent on that person (above, over its own answers) would pass the cap. So what a partner is
  told (an answer, a cached answer, a refusal) depends only on its own queries and the curator's settings,
  never on another partner's: no partner learns which rows others asked about. The population's ledger
  adds every grant's spending up, per person (``ledger``).
* **Raw answers are on the ledger too**: a grant without output privacy discloses y as measured, which makes
  the output epsilon of that person unbounded; the ledger records it (epsilon NULL) and the report says so.
  It does not stop another partner's private grant (that grant's refusals depend on its own answers only).

Serialisation: admitting a query (cache lookup, cap check, charge) and completing a privatised answer (which
also completes the cached repeats waiting on it) both lock the population row, so a concurrent repeat either
sees the first answer's query and waits for it, or sees it complete, and concurrent capped queries are
counted one after the other (refused exactly at the cap).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy.orm import Session

from curator_service import output_repository as outputs_repo
from curator_service import querylog
from curator_service import repository as repo
from curator_service.exceptions import InvalidInput, RowUnaffordable
from curator_service.models import Dataset, Partner, Query, Release, utcnow
from shared.privacy.ctl import CTL
from shared.protocol.schemas import (
    OutputLedger,
    OutputPrivacy,
    OutputPrivacyPublic,
    OutputRowTotal,
    RowExclusions,
)

__all__ = [
    "OutputPolicy",
    "admit",
    "charge",
    "exclusions",
    "ledger",
    "policy_of",
    "record_answer",
    "serialise",
    "settle_repeat",
]

#: Relative slack on the cap (sums of floats): a total within it of the cap is at the cap.
_CAP_SLACK = 1e-9
#: Rows listed in the ledger (largest totals first).
LEDGER_ROWS = 1000


@lru_cache(maxsize=64)
def _ctl(epsilon: float, B: float, R: float) -> CTL:
    """One CTL (and its OpenDP measurement) per parameter set; its sampler draws fresh OS entropy per call."""
    return CTL(epsilon, B, R)


@dataclass(frozen=True)
class OutputPolicy:
    """A partner's output privacy, as stored on the partner (``Partner.output_privacy``)."""

    epsilon: float
    B: float
    R: float
    fresh_repeats: bool
    max_epsilon_per_row: float | None
    store_raw: bool
    charged_epsilon: float

    @classmethod
    def from_request(cls, body: OutputPrivacy) -> OutputPolicy:
        charged = _ctl(body.epsilon, body.B, body.R).charged_epsilon
        if body.max_epsilon_per_row is not None and body.max_epsilon_per_row < charged * (1 - _CAP_SLACK):
            raise InvalidInput(
                f"max_epsilon_per_row = {body.max_epsilon_per_row:g} is below what one answer costs "
                f"({charged:.6g} at epsilon = {body.epsilon:g}): no query could be answered. Raise it to at "
                f"least {charged:.6g} (k fresh answers need k x {charged:.6g})."
            )
        return cls(**body.model_dump(), charged_epsilon=charged)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> OutputPolicy:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def mechanism(self) -> CTL:
        return _ctl(self.epsilon, self.B, self.R)

    def public(self) -> OutputPrivacyPublic:
        ctl = self.mechanism
        return OutputPrivacyPublic(**self.as_dict(), clip=ctl.bound, laplace_scale=ctl.scale)

    def key(self, partner_id: int, dataset_id: int, index: int) -> str:
        """Names a partner's privatised answer about row ``index``: its repeats with the same key share it
        (another partner's never do: caches are per grant)."""
        return f"p{partner_id}:d{dataset_id}:i{index}:ctl:{self.epsilon!r}:{self.B!r}:{self.R!r}"


def policy_of(partner: Partner | None) -> OutputPolicy | None:
    if partner is None or partner.output_privacy is None:
        return None
    return OutputPolicy.from_dict(partner.output_privacy)


def public_of(partner: Partner) -> OutputPrivacyPublic | None:
    policy = policy_of(partner)
    return None if policy is None else policy.public()


def person_bound(session: Session, dataset: Dataset, index: int, partner_id: int | None = None) -> float:
    """Bound on the output epsilon spent so far on the person at row ``index`` of ``dataset`` (inf: raw), by
    every partner, or by ``partner_id``'s answers only (a grant's allotment)."""
    total, raw = outputs_repo.row_output_total(session, dataset.id, index, partner_id)
    if raw:
        return math.inf
    rows = outputs_repo.rows_per_person_by_dataset(session, dataset.population_id)
    maxima = outputs_repo.dataset_output_maxima(session, dataset.population_id, partner_id)
    for other_id, (largest, any_raw) in maxima.items():
        if any_raw:
            return math.inf
        k = rows.get(other_id, 1)
        total += (k - 1) * largest if other_id == dataset.id else k * largest
    return total


def serialise(session: Session, partner: Partner, dataset: Dataset) -> None:
    """Before a query of ``partner`` is inserted: lock its population when its answers are privatised."""
    if partner.output_privacy is not None:
        repo.lock_population(session, dataset.population_id)


def admit(session: Session, partner: Partner, dataset: Dataset, query: Query) -> None:
    """Decide how a just-added (flushed, uncommitted) query is answered, and charge its person.

    Raw grant: an unbounded charge. Cached repeat: point the query at the row's first noisy answer (and
    complete it now if that answer exists). Otherwise: refuse past the cap (``Conflict``: the caller's
    transaction, with its quota charge, rolls back), else charge ``charged_epsilon``.
    """
    policy = policy_of(partner)
    if policy is None:
        charge(session, dataset, query, None)
        return
    repo.lock_population(session, dataset.population_id)
    query.output_key = policy.key(partner.id, dataset.id, query.row_index)
    if not policy.fresh_repeats:
        source = outputs_repo.first_output_answer(session, query.output_key, exclude_id=query.id)
        if source is not None:
            query.source_query_id = source.id
            query.charged_epsilon = 0.0
            if source.status == "complete":
                query.status, query.y, query.completed_at = "complete", source.y, utcnow()
                session.flush()
                querylog.append_to_chain(session, query.id)
            else:
                session.flush()
            return
    cap = policy.max_epsilon_per_row
    spent = person_bound(session, dataset, query.row_index, partner.id) if cap is not None else 0.0
    if cap is not None and spent + policy.charged_epsilon > cap * (1 + _CAP_SLACK):
        raise RowUnaffordable(
            f"this grant's output allotment for the person in row {query.row_index} is used up: "
            f"max_epsilon_per_row = {cap:g}, this grant's answers have spent up to {spent:.6g} on them "
            f"(its answers about this row, and about every row of the same people in the population's other "
            f"datasets), and one more answer costs {policy.charged_epsilon:.6g}. Nothing was charged; query "
            "another row (GET /v1/releases/{id}/exclusions lists the rows this grant can no longer have)."
        )
    query.charged_epsilon = policy.charged_epsilon
    charge(session, dataset, query, policy.charged_epsilon)


def exclusions(session: Session, partner: Partner, release: Release) -> RowExclusions:
    """The rows of ``release`` that ``admit`` would refuse for ``partner`` now: those whose person's bound
    under this grant's own answers (``person_bound`` with ``partner_id``) plus one charged answer passes the
    grant's ``max_epsilon_per_row``. A row with a cached answer (a grant without ``fresh_repeats``) is never
    refused: its repeats are free. Computed for every row at once: the bound of a row is its own total under
    this grant plus a term common to the whole dataset (this grant's largest totals in the population's other
    datasets, and k - 1 times its largest here for k rows per person)."""
    policy = policy_of(partner)
    n = int(release.n)
    base = RowExclusions(
        release_id=release.id,
        n=n,
        excluded=[],
        only_allowed=None,
        max_epsilon_per_row=None if policy is None else policy.max_epsilon_per_row,
        charged_epsilon=None if policy is None else policy.charged_epsilon,
        statement="",
    )
    if policy is None or policy.max_epsilon_per_row is None:
        why = "answers are raw" if policy is None else "the grant sets no max_epsilon_per_row"
        return base.model_copy(update={"statement": f"No row is excluded: {why}, so no answer is refused."})
    dataset = repo.get_dataset(session, release.dataset_id)
    assert dataset is not None  # a release keeps its dataset
    limit = policy.max_epsilon_per_row * (1 + _CAP_SLACK) - policy.charged_epsilon
    common = 0.0
    rows_per_person = outputs_repo.rows_per_person_by_dataset(session, dataset.population_id)
    for other_id, (largest, any_raw) in outputs_repo.dataset_output_maxima(
        session, dataset.population_id, partner.id
    ).items():
        k = rows_per_person.get(other_id, 1)
        weight = k - 1 if other_id == dataset.id else k
        common = math.inf if any_raw else common + weight * largest
    cached: set[int] = set()
    if not policy.fresh_repeats:
        cached = {
            i
            for i, key in outputs_repo.cached_answer_keys(session, partner.id, dataset.id)
            if key == policy.key(partner.id, dataset.id, i)
        }
    rule = (
        f"A row is excluded when this grant's answers about its person (its row here, plus this grant's "
        f"largest totals in the population's other datasets) leave less than one answer's "
        f"{policy.charged_epsilon:.6g} below max_epsilon_per_row = {policy.max_epsilon_per_row:g}"
        + ("" if policy.fresh_repeats else "; a row already answered is repeated from its cache, free")
        + "."
    )
    if common > limit:  # no row without a cached answer fits: only the cached ones are left
        allowed = sorted(i for i in cached if 0 <= i < n)
        return base.model_copy(
            update={
                "only_allowed": allowed,
                "statement": f"{rule} No new person can afford an answer: only the {len(allowed)} row(s) "
                "with a cached answer can still be asked about.",
            }
        )
    excluded = sorted(
        i
        for i, total, raw in outputs_repo.partner_row_totals(session, dataset.id, partner.id)
        if i not in cached and 0 <= i < n and (raw or total + common > limit)
    )
    return base.model_copy(
        update={"excluded": excluded, "statement": f"{rule} {len(excluded)} row(s) are excluded."}
    )


def charge(
    session: Session, dataset: Dataset, query: Query, epsilon: float | None, *, answer_no: int = 0
) -> None:
    """Charge an answer about ``query``'s row to its person: ``epsilon`` (None: raw, unbounded);
    ``answer_no`` 0 for the query's answer, k for its k-th supersession (``services.corrections``)."""
    session.flush()  # the query (and its admission fields) before the charge that names it
    outputs_repo.add_output_charge(
        session,
        population_id=dataset.population_id,
        dataset_id=dataset.id,
        row_index=query.row_index,
        query_id=query.id,
        partner_id=query.partner_id,
        epsilon=epsilon,
        answer_no=answer_no,
    )


def record_answer(
    session: Session, query: Query, dataset: Dataset, measured: float, *, inserted: bool = False
) -> bool:
    """Complete ``query`` with its answer to ``measured`` (privatised under its partner's grant) and link it
    into the query log, with the cached repeats waiting on it. False when it was complete already.

    ``inserted``: the query was inserted by this same transaction (after ``admit``, which took the
    population lock already, and ``querylog.lock_release``). Nothing else has seen it, so it is pending and
    no repeat waits on it: it is completed and linked in one go (``querylog.complete_and_link``).
    """
    policy = policy_of(repo.get_partner(session, query.partner_id)) if query.output_key is not None else None
    if policy is None:
        answered, raw = measured, None
    else:
        if not inserted:
            repo.lock_population(session, dataset.population_id)
        answered = float(policy.mechanism.privatise(measured))
        raw = measured if policy.store_raw else None
    if inserted:
        querylog.complete_and_link(session, query, answered, raw)
        return True
    if not repo.complete_query(session, query.id, answered, y_raw=raw):
        return False
    querylog.append_to_chain(session, query.id)
    for waiting in outputs_repo.pending_repeats(session, query.id):
        if repo.complete_query(session, waiting, answered):
            querylog.append_to_chain(session, waiting)
    return True


def settle_repeat(session: Session, query: Query) -> bool:
    """Complete a cached repeat whose first answer has arrived; False while that answer is pending."""
    assert query.source_query_id is not None
    source = repo.refresh_query(session, query.source_query_id)
    if source is None or source.status != "complete" or source.y is None:
        return False
    if repo.complete_query(session, query.id, source.y):
        querylog.append_to_chain(session, query.id)
    return True


def _statement(led: OutputLedger, policies: list[OutputPolicy]) -> str:
    if not (led.answers_privatised or led.answers_raw or led.answers_cached):
        text = "No outcome of this population has been answered yet."
    elif led.unbounded:
        text = (
            f"{led.answers_raw} outcome(s) of this population were answered as measured, to partners without "
            "output privacy: the output epsilon of the people they are about is unbounded (the value itself "
            "was disclosed), and the largest per-person total is therefore unbounded too."
        )
    else:
        text = (
            f"Every outcome answered about this population was privatised with CTL (clipped to +-(B + R), "
            f"plus Laplace noise of scale 2 (B + R) / epsilon, OpenDP's sampler): {led.answers_privatised} "
            f"charged answer(s), {led.answers_cached} cached repeat(s) at no cost. Each answer is "
            "epsilon-DP for its person (LDP-BO, Lemma 1); one person's answers compose by summing their "
            f"epsilons, at most {led.largest_person_total:.6g} so far."
        )
    if policies:
        text += " Grants with output privacy: " + "; ".join(
            f"epsilon {p.epsilon:g} (charged {p.charged_epsilon:.6g}) with B = {p.B:g}, R = {p.R:g}, "
            + ("fresh answers per play" if p.fresh_repeats else "repeats cached")
            + (f", capped at {p.max_epsilon_per_row:g} per person" if p.max_epsilon_per_row else "")
            for p in policies
        )
        text += "."
    return text


def ledger(session: Session, population_id: int, *, rows: int = LEDGER_ROWS) -> OutputLedger:
    """The population's output ledger: counts, epsilons per answer, the per-row and per-person totals (every
    partner's answers together; a dataset with k rows per person counts its largest row total k times)."""
    counts = outputs_repo.output_counts(session, population_id)
    maxima = outputs_repo.dataset_output_maxima(session, population_id)
    per_person = outputs_repo.rows_per_person_by_dataset(session, population_id)
    unbounded = any(raw for _, raw in maxima.values())
    largest_row = max((m for m, _ in maxima.values()), default=0.0)
    led = OutputLedger(
        answers_privatised=counts["privatised"],
        answers_cached=counts["cached"],
        answers_raw=counts["raw"],
        epsilon_per_answer=outputs_repo.output_epsilons(session, population_id),
        largest_row_total=None if unbounded else largest_row,
        largest_person_total=None
        if unbounded
        else sum(per_person.get(d, 1) * m for d, (m, _) in maxima.items()),
        unbounded=unbounded,
        statement="",
        rows=[
            OutputRowTotal(dataset_id=d, index=i, answers=a, epsilon=None if raw else e)
            for d, i, a, e, raw in outputs_repo.output_rows(session, population_id, limit=rows)
        ],
    )
    policies = [
        p
        for p in (policy_of(partner) for partner in outputs_repo.partners_answering(session, population_id))
        if p
    ]
    return led.model_copy(update={"statement": _statement(led, list(dict.fromkeys(policies)))})
