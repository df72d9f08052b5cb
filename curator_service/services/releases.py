"""Releases: check-and-spend the population's budget, run the chosen mechanism, store Z immutably.

Mechanisms (``ReleaseCreate.mechanism``):

* ``gaussian`` (default): ``shared.privacy.gaussian.gaussian_release``, (epsilon, delta)-DP for one row
  moving by norm <= 1 in scaled units; its ledger charge records the noise multiplier. With the setting
  ``backend = "dask"`` it runs on the curator's Dask cluster (``ComputeBackend``,
  ``shared.distributed.release.gaussian_release_dask``): the same mechanism, the same Z for the same
  randomness, the same charge.
* ``po-gp-ucb``: the paper's Algorithm 1 (``shared.privacy.po_gp_ucb``), served only with
  ``acknowledge_no_guarantee``; its record says ``formal_guarantee: false``.

What the population is charged. A Gaussian release is (1/z)-GDP for a change of norm 1 in the dataset's
scaled units; one person's largest change in the population's relation is a change of norm
c = max(1, reference factor) sqrt(rows_per_person) (``populations.charge_factor``), for which the release is
(c/z)-GDP: the ledger charges ``epsilon_for_change(c)`` at the release's delta (epsilon itself when c = 1)
and records the noise multiplier z / c. A release without a guarantee (Algorithm 1, ``allow_large_delta``,
``max_norm`` data) is charged its nominal epsilon as a label and turns the population's
``formal_guarantee`` false. delta adds up: the population's total (spent plus asked) must stay below
1 / n for the smallest n of its datasets, unless the release sends ``allow_large_delta``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from sqlalchemy.orm import Session

from curator_service import faults
from curator_service import repository as repo
from curator_service.config import Settings
from curator_service.db import Database
from curator_service.exceptions import Conflict, Forbidden, Gone, InvalidInput, NotFound, PayloadTooLarge
from curator_service.models import Dataset, LedgerEntry, Population, Release, utcnow
from curator_service.services import outputs, populations
from curator_service.services.auth import Principal
from curator_service.services.datasets import get_dataset, live_dataset
from curator_service.storage import ArrayStore
from shared.errors import InputDataError
from shared.privacy.gaussian import (
    GaussianCalibration,
    GaussianRelease,
    calibrate,
    epsilon_for_change,
    gaussian_release,
)
from shared.privacy.lattice import sampler_margins
from shared.privacy.po_gp_ucb import release_projection
from shared.privacy.rng import os_entropy_rng
from shared.protocol.schemas import ReleaseCreate, RowExclusions

if TYPE_CHECKING:
    from distributed import Client

logger = logging.getLogger(__name__)

#: Relative slack of the budget comparison (so 0.3 + 0.6 + 0.1 fits a budget of 1.0 despite rounding).
BUDGET_RTOL = 1e-9


class ComputeBackend:
    """Where the Gaussian release and the gradient oracles' per-row losses run: ``local`` (this process) or
    ``dask`` (the curator's cluster; the same answers bit for bit, ``shared.distributed``).

    One per process, on the app's components (``curator_service.main``): the Dask client is made at its first
    use (a local cluster takes seconds to start; a service that never releases never starts one) and kept
    until ``close()`` (the app's shutdown). Thread-safe: releases and steps run in worker threads.
    """

    def __init__(
        self,
        kind: Literal["local", "dask"] = "local",
        *,
        address: str | None = None,
        tls: tuple[Path, Path, Path] | None = None,
        local_workers: int = 2,
        connect: Callable[[], Client] | None = None,
    ) -> None:
        self.kind = kind
        self.address = address
        self.tls = tls
        self.local_workers = local_workers
        self._connect = connect  # the settings' dask_client (a dask-gateway cluster too); None: connect()
        self._client: Client | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> ComputeBackend:
        ca, cert, key = settings.dask_tls_ca, settings.dask_tls_cert, settings.dask_tls_key
        return cls(
            settings.backend,
            address=settings.dask_address,
            tls=(ca, cert, key) if ca is not None and cert is not None and key is not None else None,
            local_workers=settings.dask_local_workers,
            connect=settings.dask_client,
        )

    def client(self) -> Client:
        """The Dask client of this process (connecting at the first call; ``kind`` must be ``dask``)."""
        with self._lock:
            if self._client is None and self._connect is not None:
                self._client = self._connect()
            elif self._client is None:
                from shared.distributed.cluster import connect

                ca, cert, key = self.tls or (None, None, None)
                self._client = connect(
                    self.address, tls_ca=ca, tls_cert=cert, tls_key=key, n_workers=self.local_workers
                )
            return self._client

    def gaussian(
        self, X: Any, *, epsilon: float, delta: float, r: int | None, rng: np.random.Generator
    ) -> GaussianRelease:
        """``gaussian_release`` here, or ``gaussian_release_dask`` on the cluster: the same Z for one rng."""
        if self.kind == "local":
            return gaussian_release(X, epsilon=epsilon, delta=delta, r=r, rng=rng)
        from shared.distributed.release import gaussian_release_dask

        return gaussian_release_dask(X, epsilon=epsilon, delta=delta, r=r, rng=rng, client=self.client())

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            closing: Any = client.close  # distributed is untyped
            closing()


LOCAL = ComputeBackend()


def fits(spent_so_far: float, extra: float, budget: float) -> bool:
    return spent_so_far + extra <= budget * (1.0 + BUDGET_RTOL)


def large_delta(delta: float, n: int) -> bool:
    """delta >= 1/n: the mechanism "publish one random row in the clear" is (0, 1/n)-DP, so such a delta
    protects nobody in particular."""
    return delta * n >= 1.0


@dataclass(frozen=True)
class _Plan:
    """What a release will do, decided before any budget is reserved."""

    calibration: GaussianCalibration | None  # gaussian only
    native: dict[str, Any] | None  # the ledger's native parameters
    formal_guarantee: bool
    charged_epsilon: float  # what the population pays, in its relation (>= params.epsilon)
    factor: float  # the change of norm one person can make, in the dataset's scaled units


def _plan(dataset: Dataset, params: ReleaseCreate, max_bytes: int) -> _Plan:
    """Refuse what a privacy officer would refuse (422), or what would not fit (413), before the budget is
    touched."""
    r = params.r if params.r is not None else dataset.d
    size = dataset.n * r * 8
    if size > max_bytes:
        raise PayloadTooLarge(
            f"this release would hold {dataset.n} x {r} float64 values ({size / 2**30:.2f} GiB); the limit "
            f"is {max_bytes / 2**30:.2f} GiB (setting POBO_CURATOR_MAX_RELEASE_BYTES): use a smaller r"
        )
    if large_delta(params.delta, dataset.n) and not params.allow_large_delta:
        raise InvalidInput(
            f"delta = {params.delta:g} is not below 1/n = {1.0 / dataset.n:.3g} (dataset {dataset.id} has "
            f"n = {dataset.n} rows): a mechanism that publishes one random row in the clear meets such a "
            "delta. "
            'Choose delta < 1/n (e.g. 1/n^2), or send "allow_large_delta": true to release anyway (recorded).'
        )
    if params.mechanism == "po-gp-ucb":
        return _Plan(None, None, formal_guarantee=False, charged_epsilon=params.epsilon, factor=1.0)
    if params.r is not None and params.r >= dataset.d:
        raise InvalidInput(
            f"r = {params.r} is not below d = {dataset.d}: a Gaussian release projects only to fewer "
            f"dimensions than the dataset's {dataset.d} features; omit r to release all {dataset.d} noisy "
            "features"
        )
    cal = calibrate(params.epsilon, params.delta, dataset.d)
    factor = populations.charge_factor(dataset)
    try:
        charged = (
            params.epsilon
            if factor <= 1.0
            else max(params.epsilon, epsilon_for_change(cal, factor, rows=dataset.rows_per_person or 1))
        )
    except InputDataError as exc:
        raise InvalidInput(
            f"{exc}. One person can change dataset {dataset.id}'s scaled rows by a norm of up to "
            f"{factor:.3g} in its population's relation: " + "; ".join(_charge_reasons(dataset))
        ) from None
    # the sampler's margins of the charged claim (``epsilon_for_change``'s for a larger change), which the
    # ledger's composition folds in (``shared.privacy.accounting``)
    margins = (
        cal.sampler
        if factor <= 1.0
        else sampler_margins(
            max(1, dataset.rows_per_person or 1) * cal.d, cal.noise_multiplier / factor, cal.delta
        )
    )
    native = {
        "kind": "gaussian",
        "noise_multiplier": cal.noise_multiplier / factor,  # in the population's relation
        "sensitivity": cal.sensitivity,
        "sigma": cal.sigma,
        "charge_factor": factor,
        "epsilon_margin": margins.epsilon,
        "delta_margin": margins.delta,
    }
    formal = dataset.formal_guarantee and not large_delta(params.delta, dataset.n)
    return _Plan(cal, native, formal_guarantee=formal, charged_epsilon=charged, factor=factor)


def planned_charge(dataset: Dataset, params: ReleaseCreate, max_bytes: int) -> tuple[float, bool]:
    """(epsilon the population would be charged, formal guarantee) of a release with ``params``, refused
    (422/413) as ``create_release`` would refuse it; nothing is reserved (the console's confirmation page
    shows it before the release is made)."""
    plan = _plan(dataset, params, max_bytes)
    return plan.charged_epsilon, plan.formal_guarantee


def _why_charged(dataset: Dataset, plan: _Plan, asked: float) -> str:
    """Why a release costs more than its epsilon (empty when it does not)."""
    if plan.charged_epsilon <= asked * (1 + BUDGET_RTOL):
        return ""
    return (
        f" (a release at epsilon {asked:g} costs epsilon {plan.charged_epsilon:.4g} here: "
        + "; ".join(_charge_reasons(dataset))
        + ")"
    )


def _charge_reasons(dataset: Dataset) -> list[str]:
    """What makes one person's change larger than the DP unit in this dataset's scaled units."""
    reasons = []
    if (dataset.reference_factor or 1.0) > 1.0:
        reasons.append(
            f"dataset {dataset.id}'s declared scales are coarser than its population's relation (one of its "
            f"scaled units spans up to {dataset.reference_factor:.3g} of the population's: "
            + ", ".join(
                f"{name} {c:.3g}x"
                for name, c in zip(dataset.features, dataset.reference_factors or [], strict=False)
                if c > 1.0
            )
            + ")"
        )
    if dataset.rows_per_person > 1:
        reasons.append(f"a person may have {dataset.rows_per_person} rows (a change of norm sqrt(k))")
    return reasons


def check_total_delta(
    session: Session, population: Population, spent: float, asked: float, allow_large_delta: bool
) -> bool:
    """Refuse (409) a charge that would take the population's total delta to 1/n or more (n: the smallest
    dataset of the population), unless ``allow_large_delta``: deltas add up, and at 1/n the guarantee
    protects nobody in particular. Returns whether the total stays below 1/n (False: allowed, without a
    guarantee)."""
    n = repo.smallest_n(session, population.id)
    if n <= 0 or not large_delta(spent + asked, n):
        return True
    if allow_large_delta:
        return False
    raise Conflict(
        f"delta adds up: {budget_label(session, population)} has spent delta {spent:g}, and this charge's "
        f"{asked:g} would take its total to {spent + asked:g}, not below 1/n = {1.0 / n:.3g} (n = {n}, its "
        "smallest dataset). Choose a smaller delta (the population has "
        f"{max(0.0, 1.0 / n - spent):.3g} left below 1/n), or send allow_large_delta: true to release anyway "
        "(recorded; the population then has no formal guarantee). Nothing was released."
    )


def budget_label(session: Session, population: Population) -> str:
    ids = repo.dataset_ids_by_population(session).get(population.id, [])
    named = f" {population.name!r}" if population.name else ""
    return f"population {population.id}{named} (datasets {', '.join(map(str, ids))})"


def _reserve(
    db: Database, dataset_id: int, params: ReleaseCreate, max_bytes: int
) -> tuple[Dataset, _Plan, int]:
    """Lock the population, check the budget (basic composition), insert a ``reserved`` entry; COMMIT."""
    with db.session(write=True) as session:
        dataset = live_dataset(session, dataset_id)
        plan = _plan(dataset, params, max_bytes)
        population = repo.lock_population(session, dataset.population_id)
        assert population is not None
        eps_spent, delta_spent = repo.ledger_totals(session, population.id)
        for name, spent, asked, budget in (
            ("epsilon", eps_spent, plan.charged_epsilon, population.epsilon_budget),
            ("delta", delta_spent, params.delta, population.delta_budget),
        ):
            if not fits(spent, asked, budget):
                why = _why_charged(dataset, plan, params.epsilon) if name == "epsilon" else ""
                raise Conflict(
                    f"privacy budget exceeded: this release needs {name}={asked:g}{why} but "
                    f"{budget_label(session, population)} has {name} {max(0.0, budget - spent):g} left "
                    f"(budget {budget:g}, spent {spent:g}); nothing was released"
                )
        below = check_total_delta(session, population, delta_spent, params.delta, params.allow_large_delta)
        if not below:  # allowed past 1/n: recorded, and without a guarantee
            plan = replace(plan, formal_guarantee=False)
        entry = LedgerEntry(
            population_id=population.id,
            dataset_id=dataset_id,
            mechanism=params.mechanism,
            epsilon=plan.charged_epsilon,
            nominal_epsilon=params.epsilon,
            delta=params.delta,
            native=plan.native,
            status="reserved",
            formal_guarantee=plan.formal_guarantee,
        )
        repo.add(session, entry)
        session.commit()  # deliberate: the reservation is the lock-free part of the check-and-spend
        return dataset, plan, entry.id


def _cancel_reservation(db: Database, entry_id: int) -> None:
    try:
        with db.session(write=True) as session:
            repo.delete_ledger_entry(session, entry_id)
            session.commit()
    except Exception:  # pragma: no cover - the entry then stays "reserved" (conservative: budget stays spent)
        logger.exception("could not cancel ledger reservation %d", entry_id)


def create_release(
    db: Database,
    store: ArrayStore,
    dataset_id: int,
    params: ReleaseCreate,
    *,
    max_bytes: int = 2 * 2**30,
    backend: ComputeBackend = LOCAL,
) -> Release:
    """Check-and-spend the population's budget, run the mechanism, store Z and the release record.

    1. One write transaction locks the dataset's population, sums its ledger (basic composition) and
       either refuses (``Conflict``, nothing written) or inserts a ``reserved`` ledger entry and COMMITS:
       the reservation must be visible to concurrent releases (of any dataset of the population) before
       the long computation starts.
    2. The mechanism runs outside any transaction (the caller is a worker thread, not the event loop), with
       a fresh OS-entropy generator, here or on the Dask cluster (``backend``: the Gaussian release only).
       If it fails, the reservation is deleted.
    3. Z is written atomically (temp name, fsync, rename); then one transaction inserts the release row and
       turns the ledger entry ``spent``. If that commit fails, the file and the reservation are removed.
    """
    dataset, plan, entry_id = _reserve(db, dataset_id, params, max_bytes)
    relpath = store.new_relpath("releases", "z")
    extra: dict[str, Any]
    try:
        X = store.load(dataset.features_path, dataset.features_sha256)
        if params.mechanism == "gaussian":
            gauss = backend.gaussian(
                X, epsilon=params.epsilon, delta=params.delta, r=params.r, rng=os_entropy_rng()
            )
            Z = gauss.Z
            extra = {"noise_std": gauss.calibration.sigma}
        else:
            assert params.r is not None and params.lift is not None
            alg1 = release_projection(
                X,
                epsilon=params.epsilon,
                delta=params.delta,
                r=params.r,
                lift=params.lift,
                rng=os_entropy_rng(),
            )
            Z = alg1.Z
            extra = {
                "lift": params.lift,
                "lifted": alg1.lifted,
                "omega": alg1.omega,
                "sigma_min": alg1.sigma_min,
            }
        del X
        sha = store.save(relpath, Z)
        faults.pause_point("release.after_file")  # crash tests: Z on disk, release row not yet committed
    except BaseException:
        store.delete(relpath)
        _cancel_reservation(db, entry_id)
        raise

    try:
        with db.session(write=True) as session:
            repo.lock_population(session, dataset.population_id)  # the erasure takes this lock too
            live_dataset(session, dataset_id)  # erased while Z was computed: Gone, and the file goes
            release = Release(
                dataset_id=dataset_id,
                mechanism=params.mechanism,
                n=int(Z.shape[0]),
                r=int(Z.shape[1]),
                epsilon=params.epsilon,
                delta=params.delta,
                scaling=dict(dataset.scaling),
                formal_guarantee=plan.formal_guarantee,
                allow_large_delta=params.allow_large_delta,
                acknowledged_no_guarantee=params.acknowledge_no_guarantee and params.mechanism == "po-gp-ucb",
                z_path=relpath,
                sha256=sha,
                **extra,
            )
            repo.add(session, release)
            reserved = repo.get_ledger_entry(session, entry_id)
            if reserved is None:  # pragma: no cover - nobody else deletes reservations
                raise Conflict("the budget reservation of this release vanished; nothing was released")
            reserved.status = "spent"
            reserved.release_id = release.id
            reserved.updated_at = utcnow()
            if "sigma_min" in extra:
                repo.set_sigma_min(session, dataset_id, extra["sigma_min"])
            session.commit()
    except BaseException:
        store.delete(relpath)
        _cancel_reservation(db, entry_id)
        raise
    return release


def get_release(session: Session, principal: Principal, release_id: int) -> Release:
    """The release, if the principal may read it (admin: any; partner: granted ones only).

    A partner gets the same 404 for a release that does not exist and for one it was not granted, so that
    it cannot learn which release ids exist.
    """
    if principal.is_admin:
        release = repo.get_release(session, release_id)
    else:
        assert principal.partner_id is not None
        release = repo.get_granted_release(session, release_id, principal.partner_id)
    if release is None:
        raise NotFound(f"release {release_id} does not exist")
    if release.erased_at is not None and not principal.is_admin:
        raise Gone(f"release {release_id} was erased: its dataset was erased by the curator")
    return release


def row_exclusions(session: Session, principal: Principal, release_id: int) -> RowExclusions:
    """The rows of a granted release that the calling partner's grant can no longer be answered about
    (``outputs.exclusions``); an admin is told to ask with the partner's token."""
    if principal.is_admin or principal.partner_id is None:
        raise Forbidden(
            "exclusions are a partner grant's own: call GET /v1/releases/{id}/exclusions with the partner's "
            "token (the ledger, GET /v1/datasets/{id}/ledger, shows every partner's charges)"
        )
    release = get_release(session, principal, release_id)
    partner = repo.get_partner(session, principal.partner_id)
    assert partner is not None  # the token was just resolved to it
    return outputs.exclusions(session, partner, release)


def list_releases(session: Session, principal: Principal, dataset_id: int | None = None) -> Sequence[Release]:
    if principal.is_admin:
        if dataset_id is not None:
            get_dataset(session, dataset_id)
        return repo.list_releases(session, dataset_id=dataset_id)
    if dataset_id is not None:
        raise Forbidden("datasets are curator-private; list your releases with GET /v1/releases")
    assert principal.partner_id is not None
    return repo.list_releases(session, ids=repo.granted_release_ids(session, principal.partner_id))


def _check_not_erased(release: Release) -> None:
    if release.erased_at is not None:
        raise Gone(f"release {release.id} was erased: its dataset was erased by the curator")


def release_file(store: ArrayStore, release: Release) -> tuple[str, str]:
    """(verified absolute path of the release's .npy, sha256)."""
    _check_not_erased(release)
    return str(store.verify(release.z_path, release.sha256)), release.sha256


#: Most numbers one JSON page of release rows may hold (~40 MB of JSON); the .npy download has no limit.
MAX_JSON_VALUES = 2_000_000


def release_rows(
    store: ArrayStore, release: Release, offset: int, limit: int | None
) -> tuple[list[list[float]], int]:
    _check_not_erased(release)
    if offset > release.n:
        raise InvalidInput(f"offset {offset} is past the end: release {release.id} has n = {release.n} rows")
    stop = release.n if limit is None else min(release.n, offset + limit)
    if (stop - offset) * release.r > MAX_JSON_VALUES:
        rows = max(1, MAX_JSON_VALUES // release.r)
        raise PayloadTooLarge(
            f"{stop - offset} rows x {release.r} values are too many for one JSON answer (at most "
            f"{MAX_JSON_VALUES}): download the .npy file (Accept: application/x-npy, or ?format=npy), or "
            f"page with ?offset=...&limit={rows}"
        )
    Z = store.load(release.z_path, release.sha256)
    return np.asarray(Z[offset:stop]).tolist(), offset
