"""Populations: budgets belong to the people in the rows, not to uploads.

A dataset joins a population when the curator names it (upload field ``population``) or when its rows are
those of an earlier upload (``fingerprint.same_people``: the same rows, reordered columns, a subset or a
superset of the features). Every release of every dataset of a population is charged to the population's
one ledger; the budget is fixed when the population is created and no upload changes it.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.orm import Session

from curator_service import repository as repo
from curator_service.exceptions import Conflict, NotFound
from curator_service.fingerprint import Fingerprint, same_people
from curator_service.models import LedgerEntry, Population
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


def resolve(
    session: Session,
    *,
    declared: str | None,
    fingerprint: Fingerprint,
    epsilon_budget: float | None,
    delta_budget: float | None,
    default_budget: tuple[float, float],
) -> tuple[Population, str]:
    """The population of a new upload, and why: declared by name, found by content, or new."""
    repo.lock_population_lookup(session)  # two concurrent uploads of the same rows find one population
    if declared is not None:
        population = repo.get_population_by_name(session, declared)
        if population is not None:
            _check_budget(population, epsilon_budget, delta_budget, f"population {declared!r} exists")
            return population, f"declared: population {declared!r}"
        return _create(session, declared, epsilon_budget, delta_budget, default_budget), (
            f"declared: new population {declared!r}"
        )
    for other in repo.datasets_with_rows(session, fingerprint.n):
        if other.rows_hash is None:
            continue
        kind = same_people(fingerprint, other.n, other.rows_hash, other.column_hashes or [])
        if kind is not None:
            population = repo.get_population(session, other.population_id)
            assert population is not None
            why = "these rows are " + _MATCH[kind].format(id=other.id)
            _check_budget(population, epsilon_budget, delta_budget, why)
            return population, why
    return _create(session, None, epsilon_budget, delta_budget, default_budget), "new population"


def _create(
    session: Session,
    name: str | None,
    epsilon_budget: float | None,
    delta_budget: float | None,
    default_budget: tuple[float, float],
) -> Population:
    population = Population(
        name=name,
        epsilon_budget=float(default_budget[0] if epsilon_budget is None else epsilon_budget),
        delta_budget=float(default_budget[1] if delta_budget is None else delta_budget),
    )
    repo.add(session, population)
    return population


def get_population(session: Session, population_id: int) -> Population:
    population = repo.get_population(session, population_id)
    if population is None:
        raise NotFound(f"population {population_id} does not exist")
    return population


def list_populations(session: Session) -> Sequence[Population]:
    return repo.list_populations(session)


def dataset_ids(session: Session, population_id: int) -> list[int]:
    return repo.dataset_ids_by_population(session).get(population_id, [])


def views(session: Session, populations: Sequence[Population]) -> list[PopulationPublic]:
    ids = repo.dataset_ids_by_population(session)
    spent_by = repo.ledger_totals_by_population(session)
    return [population_public(p, ids.get(p.id, []), spent_by.get(p.id, (0.0, 0.0))) for p in populations]


def spent(session: Session, population_id: int) -> tuple[float, float]:
    """(epsilon, delta) reserved or spent so far (basic composition)."""
    return repo.ledger_totals(session, population_id)


def ledger(session: Session, population_id: int) -> Sequence[LedgerEntry]:
    return repo.list_ledger(session, population_id)


def public(session: Session, population_id: int) -> PopulationPublic:
    """The population with its datasets, spending and the PLD-composed epsilon of its ledger."""
    population = get_population(session, population_id)
    return population_public(
        population,
        dataset_ids(session, population_id),
        spent(session, population_id),
        composed_epsilon(ledger(session, population_id)),
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
