"""Use cases of the curator service. No HTTP types here; errors are ``curator_service.exceptions``.

Transactions: a service receives the request's session and does not commit — the request scope commits
or rolls back (``api/deps.py``) — with two deliberate exceptions, both documented where they happen:

* ``create_release`` runs three short transactions of its own: reserve the budget (committed, so that a
  concurrent release sees it), compute outside any transaction, then store the release row together with
  the ledger entry turning ``spent``.
* ``create_query`` commits the pending query row *before* evaluating the outcome, so that a crash never
  loses the fact that a query was asked (and charged).

Randomness: every release and every noise draw uses a fresh generator seeded from OS entropy
(``shared.projection.os_entropy_rng``). No seed is accepted from the API and the projection matrix M is
never stored: it only lives inside ``release_projection``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from curator_service import faults, querylog
from curator_service import repository as repo
from curator_service.csvparse import ChunkParser, CsvStream, iter_values
from curator_service.db import Database
from curator_service.exceptions import (
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    QuotaExceeded,
)
from curator_service.models import Dataset, LedgerEntry, Partner, Query, Release, utcnow
from curator_service.storage import ArrayStore
from shared.hashchain import Verification
from shared.projection import centred_sigma_min, os_entropy_rng, privacy_table, release_projection
from shared.schemas import PrivacyReport, PrivacyRow, ReleaseCreate

logger = logging.getLogger(__name__)

#: Relative slack of the budget comparison (so 0.3 + 0.6 + 0.1 fits a budget of 1.0 despite rounding).
BUDGET_RTOL = 1e-9


# ------------------------------------------------------------------------------------------------ auth


@dataclass(frozen=True)
class Principal:
    """Who is calling: the curator's admin, or a partner (by id)."""

    kind: str  # "admin" | "partner"
    partner_id: int | None = None

    @property
    def is_admin(self) -> bool:
        return self.kind == "admin"

    @property
    def actor(self) -> str:
        return "admin" if self.is_admin else f"partner:{self.partner_id}"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def authenticate(db: Database, admin_token_hash: str, token: str) -> Principal | None:
    """The principal of a bearer token, or None. Comparisons are constant-time on sha256 digests."""
    digest = hash_token(token)
    if hmac.compare_digest(digest, admin_token_hash):
        return Principal("admin")
    with db.session(write=False) as session:
        partner = repo.get_partner_by_token_hash(session, digest)
        if partner is None or not hmac.compare_digest(partner.token_hash, digest):
            return None
        if partner.revoked_at is not None:
            return None
        return Principal("partner", partner.id)


# ------------------------------------------------------------------------------------------- scaling

_SCALING_NOTES = {
    "none": "Features are released in the curator's units: neighbouring datasets differ in one row by "
    "Euclidean norm <= 1 in those units (formal guarantee holds).",
    "per_feature": "Column j was divided by the curator-declared scale s_j (unlisted features: s_j = 1); "
    "the DP unit is a row change of Euclidean norm <= 1 after that division (formal guarantee holds "
    "because the scales are declared, not computed from the data).",
    "max_norm": "Rows were rescaled so the largest row norm equals c (the paper's normalisation). The "
    "factor is computed from the data itself, so this release is OUTSIDE the formal (epsilon, delta) "
    "guarantee; use it to reproduce the paper, not to protect people.",
}


@dataclass(frozen=True)
class ScalingSpec:
    kind: str
    scales: dict[str, float] | None = None
    max_norm: float | None = None

    @property
    def formal_guarantee(self) -> bool:
        return self.kind != "max_norm"


def _positive_finite(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{what} must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number) or number <= 0:
        raise InvalidInput(f"{what} must be a finite number > 0, got {number!r}")
    return number


def parse_scaling(text: str | None) -> ScalingSpec:
    """``none`` | ``max_norm:<c>`` | a JSON object ``{"feature": scale, ...}``."""
    raw = (text or "none").strip()
    if raw == "none":
        return ScalingSpec("none")
    if raw.startswith("max_norm:"):
        try:
            c = float(raw.split(":", 1)[1])
        except ValueError:
            raise InvalidInput(
                f"scaling {raw!r}: expected max_norm:<c> with c a number > 0, e.g. max_norm:25"
            ) from None
        return ScalingSpec("max_norm", max_norm=_positive_finite(c, "scaling max_norm c"))
    if raw.startswith("{"):
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InvalidInput(f"scaling is not valid JSON: {exc.msg} at position {exc.pos}") from None
        if not isinstance(obj, dict) or not obj:
            raise InvalidInput("scaling JSON must be a non-empty object of feature name -> scale")
        scales = {str(k): _positive_finite(v, f"scale of feature {k!r}") for k, v in obj.items()}
        return ScalingSpec("per_feature", scales=scales)
    raise InvalidInput(
        f'scaling must be "none", "max_norm:<c>" or a JSON object of per-feature scales, got {raw[:60]!r}'
    )


def scaling_public(stored: dict[str, Any]) -> dict[str, Any]:
    """The admin-visible part of a stored scaling record (drops the data-dependent factor)."""
    kind = stored["kind"]
    return {
        "kind": kind,
        "scales": stored.get("scales"),
        "max_norm": stored.get("max_norm"),
        "formal_guarantee": kind != "max_norm",
        "note": _SCALING_NOTES[kind],
    }


# ------------------------------------------------------------------------------------------- datasets


@dataclass(frozen=True)
class DatasetUpload:
    name: str
    features: str | None = None
    objective: str | None = None
    objective_mode: str | None = None
    noise_std: float = 0.0
    scaling: str | None = None
    epsilon_budget: float = 10.0
    delta_budget: float = 1e-3


def _split_names(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",")]
    if any(not name for name in names):
        raise InvalidInput("features: empty name in the comma-separated list")
    return names


def _resolve_columns(upload: DatasetUpload, header: list[str]) -> tuple[list[int], int | None, str]:
    index = {name: j for j, name in enumerate(header)}
    objective = upload.objective.strip() if upload.objective else None
    if objective is not None and objective not in index:
        raise InvalidInput(
            f"objective column {objective!r} is not in the header (columns: {', '.join(header)})"
        )
    if upload.features and upload.features.strip():
        names = _split_names(upload.features)
        unknown = [name for name in names if name not in index]
        if unknown:
            raise InvalidInput(
                f"feature column(s) not in the header: {', '.join(map(repr, unknown))} "
                f"(columns: {', '.join(header)})"
            )
        dups = sorted({name for name in names if names.count(name) > 1})
        if dups:
            raise InvalidInput(f"feature column(s) listed twice: {', '.join(map(repr, dups))}")
        if objective is not None and objective in names:
            raise InvalidInput(f"the objective column {objective!r} cannot also be a feature")
    else:
        names = [name for name in header if name != objective]
    if not names:
        raise InvalidInput("no feature columns: the CSV needs at least one column besides the objective")
    mode = upload.objective_mode or ("column" if objective else "manual")
    if mode not in ("column", "manual"):
        raise InvalidInput(f'objective_mode must be "column" or "manual", got {mode!r}')
    if mode == "column" and objective is None:
        raise InvalidInput('objective_mode "column" needs an objective column (the form field `objective`)')
    return [index[name] for name in names], (index[objective] if objective else None), mode


def _check_upload_params(upload: DatasetUpload) -> None:
    if not upload.name.strip():
        raise InvalidInput("name must not be empty")
    if not math.isfinite(upload.noise_std) or upload.noise_std < 0:
        raise InvalidInput(f"noise_std must be a finite number >= 0, got {upload.noise_std!r}")
    _positive_finite(upload.epsilon_budget, "epsilon_budget")
    if not (0.0 < upload.delta_budget < 1.0):
        raise InvalidInput(f"delta_budget must lie strictly between 0 and 1, got {upload.delta_budget!r}")


def on_rollback(session: Session, callback: Callable[[], None]) -> None:
    """Run ``callback`` if the request's transaction does not commit (see ``api/deps.py``)."""
    session.info.setdefault("on_rollback", []).append(callback)


def create_dataset(
    session: Session,
    store: ArrayStore,
    upload: DatasetUpload,
    file: BinaryIO,
    *,
    size: int | None,
    max_upload_bytes: int,
    parse_workers: int = 1,
) -> Dataset:
    """Parse a CSV upload into a float64 feature array (+ outcome array) and record the dataset.

    The scaling is applied to the features before they are stored, so everything downstream (sigma_min,
    releases) works in the DP unit. The files are committed to disk first; if the request's transaction
    then fails they are deleted again (``on_rollback``).
    """
    _check_upload_params(upload)
    spec = parse_scaling(upload.scaling)
    if size is not None and size > max_upload_bytes:
        raise PayloadTooLarge(
            f"the CSV is {size} bytes; the limit is {max_upload_bytes} bytes "
            "(setting POBO_CURATOR_MAX_UPLOAD_BYTES)"
        )
    stream = CsvStream(file)
    header = stream.header.names
    feat_cols, obj_col, mode = _resolve_columns(upload, header)
    feature_names = [header[j] for j in feat_cols]
    d = len(feat_cols)
    divisors: np.ndarray | None = None
    if spec.kind == "per_feature":
        assert spec.scales is not None
        unknown = [name for name in spec.scales if name not in feature_names]
        if unknown:
            raise InvalidInput(f"scaling names unknown feature(s): {', '.join(map(repr, unknown))}")
        divisors = np.array([spec.scales.get(name, 1.0) for name in feature_names])

    usecols = feat_cols + ([obj_col] if obj_col is not None else [])
    parser = ChunkParser(stream.header, usecols)
    feat_rel = store.new_relpath("datasets", "features")
    out_rel = store.new_relpath("datasets", "outcomes") if obj_col is not None else None
    feat_writer = store.stream_writer(feat_rel, d)
    out_writer = store.stream_writer(out_rel, None) if out_rel else None
    max_norm_sq = 0.0
    try:
        for values in iter_values(stream, parser, workers=parse_workers):
            if values.shape[0] == 0:
                continue
            feats = values[:, :d]
            if divisors is not None:
                feats = feats / divisors
            if spec.kind == "max_norm":
                max_norm_sq = max(max_norm_sq, float(np.einsum("ij,ij->i", feats, feats).max()))
            feat_writer.append(feats)
            if out_writer is not None:
                out_writer.append(np.ascontiguousarray(values[:, d]))
        n = feat_writer.rows
        if n < 2:
            raise InvalidInput(f"the CSV needs at least 2 data rows, got {n}")
        factor: float | None = None
        if spec.kind == "max_norm":
            assert spec.max_norm is not None
            if max_norm_sq <= 0.0:
                raise InvalidInput("max_norm scaling is undefined: every feature row has norm 0")
            factor = spec.max_norm / math.sqrt(max_norm_sq)
            X = feat_writer.open_memmap()
            step = max(1, (32 * 2**20) // (8 * d))
            for start in range(0, n, step):
                X[start : start + step] *= factor
            X.flush()
            del X
        feat_sha = feat_writer.commit()
        out_sha = out_writer.commit() if out_writer is not None else None
    except BaseException:
        feat_writer.abort()
        if out_writer is not None:
            out_writer.abort()
        store.delete(feat_rel)
        store.delete(out_rel)
        raise

    def _remove_files() -> None:
        store.delete(feat_rel)
        store.delete(out_rel)

    on_rollback(session, _remove_files)
    scaling = {
        "kind": spec.kind,
        "scales": spec.scales,
        "max_norm": spec.max_norm,
        "divisors": divisors.tolist() if divisors is not None else None,
        "factor": factor,
    }
    dataset = Dataset(
        name=upload.name.strip(),
        n=n,
        d=d,
        features=feature_names,
        objective=header[obj_col] if obj_col is not None else None,
        objective_mode=mode,
        noise_std=float(upload.noise_std),
        scaling=scaling,
        formal_guarantee=spec.formal_guarantee,
        csv_sha256=stream.sha256,
        features_path=feat_rel,
        features_sha256=feat_sha,
        outcomes_path=out_rel,
        outcomes_sha256=out_sha,
        sigma_min=None,
        epsilon_budget=float(upload.epsilon_budget),
        delta_budget=float(upload.delta_budget),
    )
    repo.add(session, dataset)
    return dataset


def get_dataset(session: Session, dataset_id: int) -> Dataset:
    dataset = repo.get_dataset(session, dataset_id)
    if dataset is None:
        raise NotFound(f"dataset {dataset_id} does not exist")
    return dataset


def list_datasets(session: Session) -> tuple[Sequence[Dataset], dict[int, tuple[float, float]]]:
    return repo.list_datasets(session), repo.ledger_totals_by_dataset(session)


def spent(session: Session, dataset_id: int) -> tuple[float, float]:
    return repo.ledger_totals(session, dataset_id)


def ledger(session: Session, dataset_id: int) -> Sequence[LedgerEntry]:
    get_dataset(session, dataset_id)
    return repo.list_ledger(session, dataset_id)


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
    dataset = get_dataset(session, dataset_id)
    eps_spent, delta_spent = repo.ledger_totals(session, dataset_id)
    session.commit()  # end the (read-only) transaction before the possibly long sigma_min pass; no expiry
    sigma_min = dataset_sigma_min(db, store, dataset)
    table = privacy_table(sigma_min, epsilon, delta, r_max)
    feasible = [r for r, _, ok in table if ok]
    eps_left = max(0.0, dataset.epsilon_budget - eps_spent)
    delta_left = max(0.0, dataset.delta_budget - delta_spent)
    return PrivacyReport(
        dataset_id=dataset.id,
        epsilon=epsilon,
        delta=delta,
        sigma_min=sigma_min,
        recommended_r=max(feasible) if feasible else None,
        table=[PrivacyRow(r=r, omega=w, feasible=ok) for r, w, ok in table],
        epsilon_spent=eps_spent,
        delta_spent=delta_spent,
        epsilon_left=eps_left,
        delta_left=delta_left,
        fits_budget=_fits(eps_spent, epsilon, dataset.epsilon_budget)
        and _fits(delta_spent, delta, dataset.delta_budget),
        scaling=scaling_public(dataset.scaling),  # type: ignore[arg-type]
    )


# ------------------------------------------------------------------------------------------- releases


def _fits(spent_so_far: float, extra: float, budget: float) -> bool:
    return spent_so_far + extra <= budget * (1.0 + BUDGET_RTOL)


def _cancel_reservation(db: Database, entry_id: int) -> None:
    try:
        with db.session(write=True) as session:
            repo.delete_ledger_entry(session, entry_id)
            session.commit()
    except Exception:  # pragma: no cover - the entry then stays "reserved" (conservative: budget stays spent)
        logger.exception("could not cancel ledger reservation %d", entry_id)


def create_release(db: Database, store: ArrayStore, dataset_id: int, params: ReleaseCreate) -> Release:
    """Check-and-spend the budget, run Algorithm 1, store Z and the release record.

    1. One write transaction locks the dataset row, sums the ledger (basic composition) and either
       refuses (``Conflict``, nothing written) or inserts a ``reserved`` ledger entry and COMMITS: the
       reservation must be visible to concurrent releases before the long computation starts.
    2. The projection runs outside any transaction (the caller is a worker thread, not the event loop).
       If it fails, the reservation is deleted.
    3. Z is written atomically (temp name, fsync, rename); then one transaction inserts the release row and
       turns the ledger entry ``spent``. If that commit fails, the file and the reservation are removed.
    """
    with db.session(write=True) as session:
        dataset = repo.lock_dataset(session, dataset_id)
        if dataset is None:
            raise NotFound(f"dataset {dataset_id} does not exist")
        eps_spent, delta_spent = repo.ledger_totals(session, dataset_id)
        if not _fits(eps_spent, params.epsilon, dataset.epsilon_budget):
            raise Conflict(
                f"privacy budget exceeded: this release needs epsilon={params.epsilon:g} but dataset "
                f"{dataset_id} has epsilon {max(0.0, dataset.epsilon_budget - eps_spent):g} left "
                f"(budget {dataset.epsilon_budget:g}, spent {eps_spent:g}); nothing was released"
            )
        if not _fits(delta_spent, params.delta, dataset.delta_budget):
            raise Conflict(
                f"privacy budget exceeded: this release needs delta={params.delta:g} but dataset "
                f"{dataset_id} has delta {max(0.0, dataset.delta_budget - delta_spent):g} left "
                f"(budget {dataset.delta_budget:g}, spent {delta_spent:g}); nothing was released"
            )
        entry = LedgerEntry(
            dataset_id=dataset_id, epsilon=params.epsilon, delta=params.delta, status="reserved"
        )
        repo.add(session, entry)
        session.commit()  # deliberate: the reservation is the lock-free part of the check-and-spend
        entry_id = entry.id

    relpath = store.new_relpath("releases", "z")
    try:
        X = store.load(dataset.features_path, dataset.features_sha256)
        result = release_projection(
            X, epsilon=params.epsilon, delta=params.delta, r=params.r, lift=params.lift, rng=os_entropy_rng()
        )
        del X
        sha = store.save(relpath, result.Z)
        faults.pause_point("release.after_file")  # crash tests: Z on disk, release row not yet committed
    except BaseException:
        store.delete(relpath)
        _cancel_reservation(db, entry_id)
        raise

    scaling = dict(dataset.scaling)
    try:
        with db.session(write=True) as session:
            release = Release(
                dataset_id=dataset_id,
                n=int(result.Z.shape[0]),
                r=int(result.Z.shape[1]),
                epsilon=params.epsilon,
                delta=params.delta,
                lift=params.lift,
                lifted=result.lifted,
                omega=result.omega,
                sigma_min=result.sigma_min,
                scaling=scaling,
                formal_guarantee=dataset.formal_guarantee,
                z_path=relpath,
                sha256=sha,
            )
            repo.add(session, release)
            reserved = repo.get_ledger_entry(session, entry_id)
            if reserved is None:  # pragma: no cover - nobody else deletes reservations
                raise Conflict("the budget reservation of this release vanished; nothing was released")
            reserved.status = "spent"
            reserved.release_id = release.id
            reserved.updated_at = utcnow()
            repo.set_sigma_min(session, dataset_id, result.sigma_min)
            session.commit()
    except BaseException:
        store.delete(relpath)
        _cancel_reservation(db, entry_id)
        raise
    return release


def get_release(session: Session, principal: Principal, release_id: int) -> Release:
    """The release, if the principal may read it (admin: any; partner: granted ones only)."""
    release = repo.get_release(session, release_id)
    if release is None:
        raise NotFound(f"release {release_id} does not exist")
    if not principal.is_admin:
        assert principal.partner_id is not None
        if not repo.has_grant(session, principal.partner_id, release_id):
            raise Forbidden(f"this partner token has not been granted release {release_id}")
    return release


def list_releases(session: Session, principal: Principal, dataset_id: int | None = None) -> Sequence[Release]:
    if principal.is_admin:
        if dataset_id is not None:
            get_dataset(session, dataset_id)
        return repo.list_releases(session, dataset_id=dataset_id)
    if dataset_id is not None:
        raise Forbidden("datasets are curator-private; list your releases with GET /v1/releases")
    assert principal.partner_id is not None
    return repo.list_releases(session, ids=repo.granted_release_ids(session, principal.partner_id))


def release_file(store: ArrayStore, release: Release) -> tuple[str, str]:
    """(verified absolute path of the release's .npy, sha256)."""
    return str(store.verify(release.z_path, release.sha256)), release.sha256


def release_rows(
    store: ArrayStore, release: Release, offset: int, limit: int | None
) -> tuple[list[list[float]], int]:
    Z = store.load(release.z_path, release.sha256)
    if offset > release.n:
        raise InvalidInput(f"offset {offset} is past the end: release {release.id} has n = {release.n} rows")
    stop = release.n if limit is None else min(release.n, offset + limit)
    return np.asarray(Z[offset:stop]).tolist(), offset


# ------------------------------------------------------------------------------------------- partners


def new_token() -> str:
    """A partner bearer token: 32 random bytes (256 bits), URL-safe, with a recognisable prefix."""
    return "pobo_p_" + secrets.token_urlsafe(32)


def _check_release_ids(session: Session, release_ids: Sequence[int]) -> None:
    missing = sorted(set(release_ids) - repo.existing_release_ids(session, release_ids))
    if missing:
        raise InvalidInput(f"unknown release id(s): {', '.join(map(str, missing))}")


def create_partner(
    session: Session, *, name: str, release_ids: Sequence[int], max_queries: int
) -> tuple[Partner, str]:
    _check_release_ids(session, release_ids)
    token = new_token()
    partner = Partner(name=name.strip() or name, token_hash=hash_token(token), max_queries=max_queries)
    repo.add(session, partner)
    repo.add_grants(session, partner.id, release_ids)
    return partner, token


def get_partner(session: Session, partner_id: int) -> Partner:
    partner = repo.get_partner(session, partner_id)
    if partner is None:
        raise NotFound(f"partner {partner_id} does not exist")
    return partner


def grant(session: Session, partner_id: int, release_ids: Sequence[int]) -> Partner:
    partner = get_partner(session, partner_id)
    _check_release_ids(session, release_ids)
    repo.add_grants(session, partner_id, release_ids)
    return partner


def revoke(session: Session, partner_id: int) -> Partner:
    partner = get_partner(session, partner_id)
    if partner.revoked_at is None:
        partner.revoked_at = utcnow()
        session.flush()
    return partner


def granted(session: Session, partner_id: int) -> list[int]:
    return repo.granted_release_ids(session, partner_id)


def list_partners(session: Session) -> tuple[Sequence[Partner], dict[int, list[int]]]:
    return repo.list_partners(session), repo.grants_by_partner(session)


# -------------------------------------------------------------------------------------------- queries


def _column_outcome(store: ArrayStore, dataset: Dataset, index: int) -> float:
    """Stored outcome of row ``index`` plus fresh N(0, noise_std^2) noise (a new OS-entropy draw)."""
    assert dataset.outcomes_path is not None and dataset.outcomes_sha256 is not None
    y = store.load(dataset.outcomes_path, dataset.outcomes_sha256)
    value = float(y[index])
    if dataset.noise_std > 0:
        value += float(dataset.noise_std * os_entropy_rng().standard_normal())
    return value


def _settle(session: Session, store: ArrayStore, query: Query) -> Query:
    """Evaluate a pending ``column`` query (idempotent: the first completion wins) and commit."""
    if query.status != "pending":
        return query
    release = repo.get_release(session, query.release_id)
    assert release is not None
    dataset = repo.get_dataset(session, release.dataset_id)
    assert dataset is not None
    if dataset.objective_mode != "column":
        return query
    y = _column_outcome(store, dataset, query.row_index)
    if repo.complete_query(session, query.id, y):
        querylog.append_to_chain(session, query.id)  # same transaction: outcome and its chain link
    session.commit()  # deliberate: the outcome is on record before it is sent
    fresh = repo.refresh_query(session, query.id)
    assert fresh is not None
    return fresh


def create_query(
    session: Session,
    store: ArrayStore,
    principal: Principal,
    release_id: int,
    index: int,
    idempotency_key: str | None,
) -> tuple[Query, bool]:
    """Ask for the outcome of row ``index``. Returns (query, replayed).

    Order (each step matters):
    1. access: the release exists (404) and is granted to this partner (403);
    2. an ``Idempotency-Key`` seen before returns that query again, never charged twice (a different
       release or index under the same key is a 409);
    3. the index is in range (422), one query is taken from the quota (429);
    4. the query row (``pending``) is COMMITTED — before anything is evaluated, so a crash cannot lose it;
       a concurrent twin with the same key fails the unique constraint here, is rolled back (its quota
       charge with it) and returns the winner's query;
    5. ``column`` outcomes are evaluated and committed; ``manual`` ones stay pending until the curator
       posts the measured value.
    """
    assert principal.partner_id is not None
    partner_id = principal.partner_id
    release = repo.get_release(session, release_id)
    if release is None:
        raise NotFound(f"release {release_id} does not exist")
    if not repo.has_grant(session, partner_id, release_id):
        raise Forbidden(f"this partner token has not been granted release {release_id}")
    if idempotency_key is not None:
        existing = repo.get_query_by_key(session, partner_id, idempotency_key)
        if existing is not None:
            return _replay(session, store, existing, release_id, index), True
    if index >= release.n:
        raise InvalidInput(
            f"index {index} is out of range: release {release_id} has n = {release.n} rows "
            f"(valid 0..{release.n - 1})"
        )
    if not repo.charge_quota(session, partner_id):
        partner = repo.get_partner(session, partner_id)
        used, quota = (partner.queries_used, partner.max_queries) if partner else (0, 0)
        raise QuotaExceeded(
            f"query quota used up: this partner has used {used} of its {quota} queries; "
            "ask the curator to raise max_queries"
        )
    query = Query(
        release_id=release_id,
        partner_id=partner_id,
        row_index=index,
        status="pending",
        y=None,
        idempotency_key=idempotency_key,
    )
    session.add(query)
    try:
        session.commit()  # deliberate: the question is on record before its answer exists
    except IntegrityError:
        session.rollback()
        if idempotency_key is None:
            raise
        existing = repo.get_query_by_key(session, partner_id, idempotency_key)
        if existing is None:
            raise
        return _replay(session, store, existing, release_id, index), True
    faults.pause_point("query.after_commit")  # crash tests: the query is on record, not yet answered
    return _settle(session, store, query), False


def _replay(session: Session, store: ArrayStore, existing: Query, release_id: int, index: int) -> Query:
    if existing.release_id != release_id or existing.row_index != index:
        raise Conflict(
            f"this Idempotency-Key was already used for query {existing.id} (release {existing.release_id}, "
            f"index {existing.row_index}); use a new key for a different query"
        )
    return _settle(session, store, existing)


def read_query(db: Database, store: ArrayStore, principal: Principal, query_id: int) -> Query:
    """A query as its partner or the admin may see it (a fresh short read, for long-polling)."""
    with db.session(write=False) as session:
        query = repo.get_query(session, query_id)
        if query is None:
            raise NotFound(f"query {query_id} does not exist")
        if not principal.is_admin and query.partner_id != principal.partner_id:
            raise Forbidden(f"query {query_id} belongs to another partner")
        return query


def post_result(session: Session, query_id: int, y: float) -> Query:
    """The curator's measured outcome of a pending ``manual`` query."""
    query = repo.get_query(session, query_id)
    if query is None:
        raise NotFound(f"query {query_id} does not exist")
    if query.status == "complete":
        raise Conflict(f"query {query_id} is already complete; a result can be posted only once")
    release = repo.get_release(session, query.release_id)
    assert release is not None
    dataset = repo.get_dataset(session, release.dataset_id)
    assert dataset is not None
    if dataset.objective_mode != "manual":
        raise Conflict(
            f"query {query_id} is on a dataset whose outcomes come from its '{dataset.objective}' column; "
            "results are posted only for objective_mode 'manual'"
        )
    if not repo.complete_query(session, query_id, y):
        raise Conflict(f"query {query_id} is already complete; a result can be posted only once")
    querylog.append_to_chain(session, query_id)
    fresh = repo.refresh_query(session, query_id)
    assert fresh is not None
    return fresh


def list_queries(session: Session, principal: Principal, release_id: int) -> Sequence[Query]:
    get_release(session, principal, release_id)
    return repo.list_queries(session, release_id, None if principal.is_admin else principal.partner_id)


def verify_queries(session: Session, principal: Principal, release_id: int) -> tuple[Verification, str]:
    """Verify the release's query-log hash chain (admin, or a partner granted the release)."""
    get_release(session, principal, release_id)
    return querylog.verify_release_chain(session, release_id)


# ------------------------------------------------------------------------------------------ access log


def access_log(
    session: Session, *, limit: int, partner_id: int | None, after_id: int | None
) -> Sequence[Any]:
    return repo.list_access_log(session, limit=limit, partner_id=partner_id, after_id=after_id)


# ------------------------------------------------------------------------------------------- start-up


def recover_pending_queries(db: Database, store: ArrayStore) -> int:
    """Evaluate ``column`` queries a crash left pending (they were committed, and charged, already)."""
    with db.session(write=False) as session:
        ids = repo.pending_column_query_ids(session)
    for query_id in ids:
        with db.session(write=True) as session:
            query = repo.get_query(session, query_id)
            if query is not None:
                _settle(session, store, query)
    if ids:
        logger.info("completed %d query(ies) left pending by an earlier crash", len(ids))
    return len(ids)


def sweep_orphans(db: Database, store: ArrayStore, min_age_seconds: float = 3600.0) -> int:
    """Delete array files that no database row refers to (leftovers of a crash mid-write) once they are
    ``min_age_seconds`` old (younger ones may belong to a write still in flight in another process)."""
    with db.session(write=False) as session:
        referenced = repo.all_array_paths(session)
    return store.sweep(referenced, min_age_seconds=min_age_seconds)
