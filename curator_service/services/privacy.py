"""The privacy report: what a release at (epsilon, delta) protects, said in the curator's own units.

Curator-private (admin only): it contains sigma_min, a statistic of the data.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from curator_service import repository as repo
from curator_service.db import Database
from curator_service.models import Dataset
from curator_service.services import outputs, populations
from curator_service.services.datasets import live_dataset
from curator_service.services.releases import fits, large_delta
from curator_service.services.scaling import covered_changes, scaling_public
from curator_service.storage import ArrayStore
from shared.errors import InputDataError
from shared.privacy.gaussian import GaussianCalibration, calibrate, epsilon_for_change
from shared.privacy.po_gp_ucb import centred_sigma_min, privacy_table
from shared.protocol.schemas import FeatureProtection, GuaranteeAtChange, PrivacyReport, PrivacyRow

#: Row changes (norm, scaled units) for which the report lists the epsilon that protects them.
LARGER_CHANGES = (1.0, 2.0, 5.0, 10.0)


def dataset_sigma_min(db: Database, store: ArrayStore, dataset: Dataset) -> float:
    """sigma_min of the centred, scaled features: computed once (one streaming pass), then cached."""
    if dataset.sigma_min is not None:
        return dataset.sigma_min
    X = store.load(dataset.features_path, dataset.features_sha256)
    value = centred_sigma_min(X)
    with db.session(write=True) as session:
        repo.set_sigma_min(session, dataset.id, value)
        session.commit()
    return value


def guarantee_statement(dataset: Dataset, cal: GaussianCalibration, features: list[FeatureProtection]) -> str:
    """One paragraph: the neighbouring relation, with an example in the curator's units."""
    example = ", ".join(f"{f.feature} alone by up to {f.covered_change:.3g}" for f in features[:2])
    more = " or any mix of features whose scaled changes have Euclidean norm <= 1" if dataset.d > 1 else ""
    text = (
        f"A Gaussian release at epsilon = {cal.epsilon:g}, delta = {cal.delta:g} adds independent Gaussian "
        f"noise of standard deviation {cal.sigma:.4g} (scaled units) to every scaled feature of every row, "
        "then centres the columns (and, with r < d, projects them: post-processing). It is (epsilon, delta)-"
        "differentially private for this neighbouring relation: two datasets differ in one person's row, and "
        f"that row's features move by Euclidean norm at most 1 in scaled units; here that is {example}{more} "
        "(in your units). Columns that are not released (the outcome, identifiers) may differ arbitrarily. "
        "A larger change of norm c is protected only at the weaker epsilon listed under larger_changes; a "
        "person with k rows, each moving by norm <= 1, makes a change of norm at most sqrt(k) (the rows are "
        "disjoint coordinates): read its epsilon off larger_changes at c = sqrt(k). "
        "The guarantee covers the released rows only; the outcomes a partner asks for are protected only by "
        "its grant's output privacy (see outcomes)."
    )
    if dataset.scaling["kind"] == "max_norm":
        text += (
            " This dataset was scaled with max_norm, whose factor was computed from the data itself: no "
            "formal guarantee holds for its releases."
        )
    return text


def relation_statement(dataset: Dataset, factor: float, charged: float | None) -> str:
    """What the release costs the population when its relation spans more than this dataset's unit."""
    if factor <= 1.0:
        return ""
    return (
        f" Its population's budget is denominated in the population's own relation (the scales of the "
        f"upload that introduced each feature) and per person: one person can change this dataset's scaled "
        f"rows by a norm of up to {factor:.3g} (reference factor {dataset.reference_factor:.3g}, "
        f"{dataset.rows_per_person} row(s) per person), so "
        + (
            f"a release at this epsilon is charged epsilon {charged:.4g}."
            if charged is not None
            else "no epsilon is proven for a release at these parameters (it would be refused)."
        )
    )


def outcomes_statement(dataset: Dataset) -> str:
    if dataset.objective_mode == "manual":
        source = "The curator posts each measured outcome by hand"
    else:
        source = f"Outcomes are read from the '{dataset.objective}' column"
    return (
        f"{source}. The outcome column is never released. A partner granted with output_privacy gets every "
        "outcome privatised by CTL(epsilon) (clipped to +-(B + R), plus Laplace noise of scale "
        "2 (B + R) / epsilon), each answer charged to its person's output ledger; a partner granted without "
        "it gets outcomes as they are measured, which leaves those people's output epsilon unbounded (see "
        f"output). noise_std (here {dataset.noise_std:g}) is simulation noise for retrospective pilots, "
        "not a "
        "privacy mechanism: repeated queries of one row average it away."
    )


def po_gp_ucb_statement(n: int, d: int) -> str:
    if n > d + 1:
        situation = (
            f"With n = {n} rows and d = {d} features (n > d + 1), whoever holds its output and two candidate "
            "datasets that differ in one row tells them apart with certainty, and whoever knows "
            f"d + 1 = {d + 1} rows recovers the projection and, when r >= d, every other row exactly."
        )
    else:
        situation = (
            f"With n = {n} rows and d = {d} features (n <= d + 1) the column-space attack does not apply, "
            "but no proof covers this release either."
        )
    return (
        "The paper's Algorithm 1 (mechanism po-gp-ucb) multiplies the centred data by a random d x r matrix, "
        "so every column of its output lies in the span of the data's columns and the all-ones vector: a "
        "d-dimensional subspace of the n-dimensional space of rows that moves when one row moves. "
        f"{situation} Its (epsilon, delta) are a label, not a guarantee: pobo keeps it to reproduce the "
        'paper and releases it only with "acknowledge_no_guarantee": true. sigma_min, table and '
        "recommended_r are its diagnostics, computed from the data and themselves outside any guarantee."
    )


def _epsilon_at(cal: GaussianCalibration, change: float, rows: int) -> float | None:
    """The epsilon protecting a change of norm ``change`` over ``rows`` rows; None when none is proven."""
    try:
        return epsilon_for_change(cal, change, rows=rows)
    except InputDataError:
        return None


def privacy_report(
    session: Session,
    db: Database,
    store: ArrayStore,
    dataset_id: int,
    *,
    epsilon: float,
    delta: float,
    r_max: int,
) -> PrivacyReport:
    dataset = live_dataset(session, dataset_id)
    population = repo.get_population(session, dataset.population_id)
    assert population is not None
    eps_spent, delta_spent = repo.ledger_totals(session, population.id)
    output_ledger = outputs.ledger(session, population.id, rows=0)
    session.commit()  # end the (read-only) transaction before the possibly long sigma_min pass; no expiry
    sigma_min = dataset_sigma_min(db, store, dataset)
    table = privacy_table(sigma_min, epsilon, delta, r_max)
    feasible = [r for r, _, ok in table if ok]
    cal = calibrate(epsilon, delta, dataset.d)
    factors = list(dataset.reference_factors or [1.0] * dataset.d)
    features = [
        FeatureProtection(feature=name, scale=scale, covered_change=change, reference_change=scale * c)
        for (name, scale, change), c in zip(
            covered_changes(dataset.scaling, list(dataset.features)), factors, strict=True
        )
    ]
    factor = populations.charge_factor(dataset)
    rows = dataset.rows_per_person or 1
    charged = epsilon if factor <= 1.0 else _epsilon_at(cal, factor, rows)
    if charged is not None:
        charged = max(epsilon, charged)
    population_formal = populations.formal_guarantee(session, population.id)
    n_min = populations.smallest_n(session, population.id) or dataset.n
    big_delta = large_delta(delta, dataset.n)
    warnings: list[str] = []
    if charged is None:
        warnings.append(
            f"A release at these parameters would be refused: one person can change this dataset's scaled "
            f"rows by a norm of up to {factor:.3g}, and no epsilon is proven for that at delta = {delta:g}; "
            "choose a larger delta or a smaller epsilon."
        )
    elif factor > 1.0:
        warnings.append(
            f"A release of this dataset is charged epsilon {charged:.4g} for epsilon {epsilon:g}: one person "
            f"can change its scaled rows by a norm of up to {factor:.3g} in its population's relation "
            f"(reference factor {dataset.reference_factor:.3g}, {dataset.rows_per_person} row(s) per person)."
        )
    if not population_formal:
        warnings.append(
            f"Population {population.id} holds a charge without a proven guarantee (a po-gp-ucb, "
            "allow_large_delta or max_norm release): its people have no formal guarantee any more, whatever "
            "later releases do."
        )
    if not big_delta and large_delta(delta_spent + delta, n_min):
        warnings.append(
            f"delta adds up: the population has spent delta {delta_spent:g}, and this release would take it "
            f"to {delta_spent + delta:g}, not below 1/n = {1.0 / n_min:.3g}; a release needs "
            "allow_large_delta and then carries no formal guarantee."
        )
    if big_delta:
        warnings.append(
            f"delta = {delta:g} is not below 1/n = {1.0 / dataset.n:.3g}: a mechanism that publishes one "
            "random row in the clear meets it. A release needs allow_large_delta and carries no formal "
            "guarantee."
        )
    if dataset.scaling["kind"] == "max_norm":
        warnings.append("max_norm scaling is computed from the data: releases carry no formal guarantee.")
    fits_budget = (
        charged is not None
        and fits(eps_spent, charged, population.epsilon_budget)
        and fits(delta_spent, delta, population.delta_budget)
    )
    if not fits_budget:
        warnings.append("a release at these parameters does not fit in the population's budget left")
    return PrivacyReport(
        dataset_id=dataset.id,
        population_id=population.id,
        epsilon=epsilon,
        delta=delta,
        n=dataset.n,
        d=dataset.d,
        mechanism="gaussian",
        formal_guarantee=dataset.formal_guarantee and not big_delta and population_formal,
        population_formal_guarantee=population_formal,
        charge_factor=factor,
        charged_epsilon=charged,
        rows_per_person=dataset.rows_per_person,
        noise_std=cal.sigma,
        guarantee=guarantee_statement(dataset, cal, features) + relation_statement(dataset, factor, charged),
        features=features,
        larger_changes=[GuaranteeAtChange(change=c, epsilon=_epsilon_at(cal, c, 1)) for c in LARGER_CHANGES],
        large_delta=big_delta,
        outcomes=outcomes_statement(dataset),
        warnings=warnings,
        po_gp_ucb=po_gp_ucb_statement(dataset.n, dataset.d),
        sigma_min=sigma_min,
        recommended_r=max(feasible) if feasible else None,
        table=[PrivacyRow(r=r, omega=w, feasible=ok) for r, w, ok in table],
        epsilon_spent=eps_spent,
        delta_spent=delta_spent,
        epsilon_left=max(0.0, population.epsilon_budget - eps_spent),
        delta_left=max(0.0, population.delta_budget - delta_spent),
        fits_budget=fits_budget,
        scaling=scaling_public(dataset.scaling),  # type: ignore[arg-type]
        output=output_ledger,
    )
