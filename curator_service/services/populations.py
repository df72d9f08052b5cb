"""Populations: budgets belong to the people in the rows, not to uploads; one relation per population.

**Which population an upload joins.** The fingerprint check always runs (``fingerprint``): an upload whose
column signatures share an informative column with an earlier upload of the same number of rows (the same
rows in any order, in other units, renamed, a subset, a superset or an overlap of its columns, a value off by
an ulp, the same outcomes with other features), or whose exact hashes match an upload made before
signatures existed, holds the same people. Then:

* no ``population`` declared: it joins the matching population (a match in two populations is a 409 asking
  which), or else starts a new one;
* ``population`` declared: it joins (or creates) that population, unless a match says the people belong to
  another one: then it is a 409 naming the matching population, unless the admin also sends
  ``acknowledge_distinct_people: true``, which is recorded on the dataset and in its population reason.

Populations guard against the curator's own staff re-using people by mistake, not against a curator who
lies (who can perturb every value).

**One relation.** A population's neighbouring relation is fixed by its first upload: one person's row
moves by Euclidean norm <= 1 in units of the declared scales of its features (``Population.reference``). A
later upload's features are matched to the reference columns (by signature; by name when the signatures
cannot tell) and each gets its factor ``c_j = lambda_j ref_j / s_j``: a change of one reference unit is
``c_j`` of this dataset's scaled units (``lambda_j`` the ratio of the columns' standard deviations, 12 for
months against years; ``s_j`` this dataset's declared scale). Features new to the population join the
reference at their declared scale (c_j = 1). A release of the dataset is then charged what it costs in the
reference relation, a change of norm ``max(1, max_j c_j)`` (times sqrt(rows_per_person)): see
``releases``. So scales may differ between uploads, and a coarser declaration is charged, never trusted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from curator_service import repository as repo
from curator_service.exceptions import Conflict, InvalidInput, NotFound
from curator_service.fingerprint import (
    MATCH_JACCARD,
    ColumnSignature,
    Fingerprint,
    jaccard,
    same_people,
    same_rows,
)
from curator_service.models import Dataset, LedgerEntry, Population
from curator_service.schemas import ledger_entry_public, population_public
from curator_service.services import outputs
from shared.privacy.accounting import Charge, pld_composition
from shared.protocol.schemas import LedgerPublic, PopulationBudget, PopulationPublic

_MATCH = {
    "identical": "the same rows as dataset {id}",
    "same-columns": "the same feature columns as dataset {id} (reordered or renamed)",
    "subset": "a subset of the features of dataset {id}",
    "superset": "the features of dataset {id} and more",
}

#: A new population's delta budget: min(1e-3, 0.1 / n) (delta adds up across releases, and 1/n is the
#: point where "publish one random row" is (0, delta)-DP: a tenth of it leaves room for several releases).
DEFAULT_DELTA_BUDGET = 1e-3
DELTA_BUDGET_FRACTION_OF_ONE_OVER_N = 0.1


def default_delta_budget(n: int) -> float:
    return min(DEFAULT_DELTA_BUDGET, DELTA_BUDGET_FRACTION_OF_ONE_OVER_N / max(1, n))


def _check_budget(
    population: Population, epsilon_budget: float | None, delta_budget: float | None, why: str
) -> None:
    asked = [
        (name, value, have)
        for name, value, have in (
            ("epsilon_budget", epsilon_budget, population.epsilon_budget),
            ("delta_budget", delta_budget, population.delta_budget),
        )
        if value is not None and abs(value - have) > 1e-12 * max(abs(have), 1.0)
    ]
    if asked:
        name, value, have = asked[0]
        raise Conflict(
            f"{why}; its population {population.id} has {name} {have:g}, this upload asked for {value:g}. "
            "A budget belongs to the people in the rows and is set once, when their population is created: "
            "leave epsilon_budget and delta_budget out to join it. Nothing was stored."
        )


def signatures_of(dataset: Dataset) -> list[ColumnSignature] | None:
    if dataset.column_signatures is None:
        return None
    return [ColumnSignature.from_json(c) for c in dataset.column_signatures]


def _describe_columns(
    mine: Sequence[ColumnSignature], theirs: Sequence[ColumnSignature], pairs: list[tuple[int, int, float]]
) -> str:
    names = []
    for i, j, _ in pairs[:3]:
        a, b = mine[i], theirs[j]
        names.append(f"'{a.name}'" if a.name == b.name else f"'{a.name}' (as '{b.name}')")
    more = f" and {len(pairs) - 3} more" if len(pairs) > 3 else ""
    return ", ".join(names) + more


def _matches(
    session: Session, fingerprint: Fingerprint, signatures: Sequence[ColumnSignature]
) -> list[tuple[Dataset, str]]:
    """The earlier uploads of the same people, each with why (exact hashes first, then signatures)."""
    found = []
    for other in repo.datasets_with_rows(session, fingerprint.n):
        kind = None
        if other.rows_hash is not None:
            kind = same_rows(fingerprint, other.n, other.rows_hash, other.column_hashes or [])
        if kind is not None:
            found.append((other, "these rows are " + _MATCH[kind].format(id=other.id)))
            continue
        theirs = signatures_of(other)
        if theirs is None:
            continue
        pairs = same_people(fingerprint.n, signatures, other.n, theirs)
        if pairs:
            found.append(
                (
                    other,
                    f"these rows share the column(s) {_describe_columns(signatures, theirs, pairs)} with "
                    f"dataset {other.id}",
                )
            )
    return found


def _label(population: Population) -> str:
    return f"population {population.id}" + (f" {population.name!r}" if population.name else "")


def resolve(
    session: Session,
    *,
    declared: str | None,
    acknowledge_distinct_people: bool,
    fingerprint: Fingerprint,
    signatures: Sequence[ColumnSignature],
    epsilon_budget: float | None,
    delta_budget: float | None,
    default_epsilon_budget: float,
) -> tuple[Population, str]:
    """The population of a new upload, and why (see the module docstring)."""
    repo.lock_population_lookup(session)  # two concurrent uploads of the same rows find one population
    matches = _matches(session, fingerprint, signatures)
    by_population: dict[int, tuple[Population, str]] = {}
    for other, why in matches:
        if other.population_id not in by_population:
            found = repo.get_population(session, other.population_id)
            assert found is not None
            by_population[other.population_id] = (found, why)
    if acknowledge_distinct_people and declared is None:
        raise InvalidInput(
            "acknowledge_distinct_people needs a declared population: name the population these people "
            "belong to (form field population)"
        )
    if declared is not None:
        population = repo.get_population_by_name(session, declared)
        contradicted = [
            (p, why) for pid, (p, why) in by_population.items() if population is None or pid != population.id
        ]
        if contradicted and not (population is not None and population.id in by_population):
            match, why = contradicted[0]
            if not acknowledge_distinct_people:
                raise Conflict(
                    f"{why}, which belongs to {_label(match)}, but this upload declares population "
                    f"{declared!r}: the fingerprint says these are people of {_label(match)}. Leave "
                    "population out (or declare "
                    + (repr(match.name) if match.name else f"the population of dataset {matches[0][0].id}")
                    + ") to join it, or send acknowledge_distinct_people=true if these are different "
                    "people (recorded). Nothing was stored."
                )
        suffix = ""
        if contradicted and acknowledge_distinct_people:
            suffix = f" (people declared distinct from {_label(contradicted[0][0])} despite a match)"
        if population is not None:
            _check_budget(population, epsilon_budget, delta_budget, f"population {declared!r} exists")
            return population, f"declared: population {declared!r}{suffix}"
        created = _create(
            session, declared, epsilon_budget, delta_budget, default_epsilon_budget, fingerprint.n
        )
        return created, f"declared: new population {declared!r}{suffix}"
    if len(by_population) > 1:
        names = " and ".join(_label(p) for p, _ in by_population.values())
        raise Conflict(
            f"these rows match datasets of {names}: declare which population they belong to (form field "
            "population). Nothing was stored."
        )
    if by_population:
        ((population, why),) = by_population.values()
        _check_budget(population, epsilon_budget, delta_budget, why)
        return population, why
    return _create(session, None, epsilon_budget, delta_budget, default_epsilon_budget, fingerprint.n), (
        "new population"
    )


def _create(
    session: Session,
    name: str | None,
    epsilon_budget: float | None,
    delta_budget: float | None,
    default_epsilon_budget: float,
    n: int,
) -> Population:
    population = Population(
        name=name,
        epsilon_budget=float(default_epsilon_budget if epsilon_budget is None else epsilon_budget),
        delta_budget=float(default_delta_budget(n) if delta_budget is None else delta_budget),
    )
    repo.add(session, population)
    return population


# ------------------------------------------------------------------------------------ the reference relation


def _legacy_reference(session: Session, population: Population, joining: Dataset) -> list[dict[str, Any]]:
    """The reference of a population made before migration 0006 (empty for a new one): the declared scales
    of its earlier datasets, by name."""
    reference: list[dict[str, Any]] = []
    for dataset in repo.datasets_of_population(session, population.id):
        if dataset.id == joining.id:
            continue
        for j, (name, scale) in enumerate(declared_scales(dataset)):
            if all(ref["name"] != name for ref in reference):
                reference.append(
                    {"name": name, "scale": scale, "std": None, "dataset_id": dataset.id, "column": j}
                )
    return reference


def declared_scales(dataset: Dataset) -> list[tuple[str, float]]:
    """(feature, raw units per scaled unit) of a dataset: its declared scale, 1, or max_norm's 1 / factor."""
    scaling = dataset.scaling
    names = list(dataset.features)
    if scaling.get("kind") == "per_feature" and scaling.get("divisors"):
        return [(n, float(s)) for n, s in zip(names, scaling["divisors"], strict=True)]
    if scaling.get("kind") == "max_norm" and scaling.get("factor"):
        return [(n, 1.0 / float(scaling["factor"])) for n in names]
    return [(n, 1.0) for n in names]


def _reference_match(
    sig: ColumnSignature | None, name: str, ref: dict[str, Any], ref_sig: ColumnSignature | None
) -> float | None:
    """How well a new column matches a reference column (None: it does not). By signature when both have
    one (an informative pair, or the same name); else, and also when the signatures differ but the names
    agree, by name: a name the population already knows is that feature (rows added or removed move the
    standardised values, and a finer scale declared for a known name must not escape its charge)."""
    if sig is not None and ref_sig is not None:
        similarity = jaccard(sig.sketch, ref_sig.sketch)
        if similarity >= MATCH_JACCARD and (
            (sig.informative and ref_sig.informative) or sig.name == ref_sig.name
        ):
            return 1.0 + similarity  # (a match by content ranks above a match by name)
    return 0.5 if ref["name"] == name else None


def attach_to_reference(session: Session, population: Population, dataset: Dataset) -> None:
    """Set ``dataset.reference_factors`` (per feature, the scaled units of this dataset that one reference
    unit spans) and ``dataset.reference_factor`` against the population's relation, and extend the relation
    with the dataset's new features (the first upload of a population defines it).

    A change of one person's row of norm <= 1 in the reference relation moves the features mapped to
    reference feature r by c_j u_r each, so this dataset's scaled row moves by
    sqrt(sum_r u_r^2 sum_{j -> r} c_j^2) <= sqrt(max_r sum_{j -> r} c_j^2): ``reference_factor``. (Two
    columns holding one reference feature, years and months, both move.)
    """
    reference = list(
        population.reference
        if population.reference is not None
        else _legacy_reference(session, population, dataset)
    )
    known = len(reference)  # the relation before this dataset: its own new features are not matched
    mine = signatures_of(dataset) or []
    cache: dict[int, list[ColumnSignature] | None] = {}
    factors: list[float] = []
    mapped: dict[int, float] = {}  # reference index -> sum of c_j^2 over this dataset's columns
    for j, (name, scale) in enumerate(declared_scales(dataset)):
        sig = mine[j] if j < len(mine) else None
        best: tuple[float, int] | None = None
        for r, ref in enumerate(reference[:known]):
            if ref["dataset_id"] not in cache:
                other = repo.get_dataset(session, int(ref["dataset_id"]))
                cache[ref["dataset_id"]] = None if other is None else signatures_of(other)
            theirs = cache[ref["dataset_id"]]
            ref_sig = theirs[int(ref["column"])] if theirs is not None and ref["column"] is not None else None
            score = _reference_match(sig, name, ref, ref_sig)
            if score is not None and (best is None or score > best[0]):
                best = (score, r)
        if best is None:
            reference.append(
                {
                    "name": name,
                    "scale": scale,
                    "std": None if sig is None else sig.std,
                    "dataset_id": dataset.id,
                    "column": j,
                }
            )
            c, r = 1.0, len(reference) - 1
        else:
            r = best[1]
            ref = reference[r]
            ratio = 1.0
            if sig is not None and ref.get("std") and sig.std > 0:
                ratio = sig.std / float(ref["std"])  # lambda_j: this column's units per reference unit
            c = ratio * float(ref["scale"]) / scale
        factors.append(c)
        mapped[r] = mapped.get(r, 0.0) + c * c
    dataset.reference_factors = factors
    dataset.reference_factor = math.sqrt(max(mapped.values())) if mapped else 1.0
    population.reference = reference


def charge_factor(dataset: Dataset) -> float:
    """The norm, in this dataset's scaled units, of one person's largest change in the population's relation:
    max(1, reference_factor) sqrt(rows_per_person) (a person's k rows are disjoint coordinates)."""
    return max(1.0, float(dataset.reference_factor or 1.0)) * math.sqrt(
        max(1, int(dataset.rows_per_person or 1))
    )


# ------------------------------------------------------------------------------------------------ reading


def get_population(session: Session, population_id: int) -> Population:
    population = repo.get_population(session, population_id)
    if population is None:
        raise NotFound(f"population {population_id} does not exist")
    return population


def list_populations(session: Session) -> Sequence[Population]:
    return repo.list_populations(session)


def dataset_ids(session: Session, population_id: int) -> list[int]:
    return repo.dataset_ids_by_population(session).get(population_id, [])


def formal_guarantee(session: Session, population_id: int) -> bool:
    """False once any charge of the population carried no proven guarantee."""
    return not repo.population_has_unproven_charge(session, population_id)


def smallest_n(session: Session, population_id: int) -> int:
    return repo.smallest_n(session, population_id)


def views(session: Session, populations: Sequence[Population]) -> list[PopulationPublic]:
    ids = repo.dataset_ids_by_population(session)
    spent_by = repo.ledger_totals_by_population(session)
    unproven = repo.populations_with_unproven_charges(session)
    smallest = repo.smallest_n_by_population(session)
    return [
        population_public(
            p,
            ids.get(p.id, []),
            spent_by.get(p.id, (0.0, 0.0)),
            formal=p.id not in unproven,
            smallest_n=smallest.get(p.id),
        )
        for p in populations
    ]


def spent(session: Session, population_id: int) -> tuple[float, float]:
    """(epsilon, delta) reserved or spent so far (basic composition)."""
    return repo.ledger_totals(session, population_id)


def ledger(session: Session, population_id: int) -> Sequence[LedgerEntry]:
    return repo.list_ledger(session, population_id)


def public(session: Session, population_id: int) -> PopulationPublic:
    """The population with its datasets, spending and the PLD-composed epsilon of its ledger (none when a
    charge carried no guarantee)."""
    population = get_population(session, population_id)
    formal = formal_guarantee(session, population_id)
    return population_public(
        population,
        dataset_ids(session, population_id),
        spent(session, population_id),
        composed_epsilon(ledger(session, population_id)) if formal else None,
        formal=formal,
        smallest_n=smallest_n(session, population_id),
    )


def ledger_public(session: Session, population_id: int) -> LedgerPublic:
    budget = public(session, population_id)
    return LedgerPublic(
        **budget.model_dump(include=set(PopulationBudget.model_fields)),
        population_id=population_id,
        entries=[ledger_entry_public(e) for e in ledger(session, population_id)],
        output=outputs.ledger(session, population_id),
    )


def composed_epsilon(entries: Sequence[LedgerEntry]) -> float | None:
    """Informational: the PLD-composed epsilon of the entries at their total delta (None if no entry)."""
    if not entries:
        return None
    charges = [Charge(e.epsilon, e.delta, e.native) for e in entries]
    return pld_composition(charges, sum(c.delta for c in charges))
