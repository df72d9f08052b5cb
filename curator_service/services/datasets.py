"""Datasets: the CSV upload (streamed, validated, scaled, fingerprinted), metadata, and the population a
dataset's releases are charged to."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np
from sqlalchemy.orm import Session

from curator_service import repository as repo
from curator_service.csvparse import ChunkParser, CsvStream, Ids, iter_rows
from curator_service.db import Database
from curator_service.exceptions import Gone, InvalidInput, NotFound, PayloadTooLarge
from curator_service.fingerprint import ColumnSignature, FingerprintBuilder, column_signatures
from curator_service.models import Dataset
from curator_service.schemas import dataset_public
from curator_service.services import populations
from curator_service.services.scaling import ScalingSpec, parse_scaling, positive_finite
from curator_service.storage import ArrayStore
from shared.protocol.schemas import DatasetPublic


@dataclass(frozen=True)
class DatasetUpload:
    name: str
    features: str | None = None
    objective: str | None = None
    objective_mode: str | None = None
    noise_std: float = 0.0
    scaling: str | None = None
    #: Budgets of a *new* population (None: the defaults below); joining an existing population, a
    #: budget that differs from the population's is a conflict (an upload never changes a budget).
    epsilon_budget: float | None = None
    delta_budget: float | None = None
    #: Declared population name: datasets of one population share one budget.
    population: str | None = None
    #: The declared population is right although the fingerprint matches another one's people (recorded).
    acknowledge_distinct_people: bool = False
    #: At most this many rows of one person in the dataset (group privacy for releases and outputs).
    rows_per_person: int = 1
    #: A column of sample ids (text, unique): kept by the curator, never a feature, never released.
    id_column: str | None = None


DEFAULT_EPSILON_BUDGET = 10.0
#: A new population's delta budget is min(DEFAULT_DELTA_BUDGET, 0.1 / n) (``populations``).
DEFAULT_DELTA_BUDGET = populations.DEFAULT_DELTA_BUDGET
#: Most rows per person an upload may declare.
MAX_ROWS_PER_PERSON = 10_000


def _split_names(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",")]
    if any(not name for name in names):
        raise InvalidInput("features: empty name in the comma-separated list")
    return names


@dataclass(frozen=True)
class Columns:
    """Where the upload's columns are in the header: features, the outcome and the ids (if any)."""

    features: list[int]
    objective: int | None
    ids: int | None
    mode: str


def _resolve_columns(upload: DatasetUpload, header: list[str]) -> Columns:
    index = {name: j for j, name in enumerate(header)}
    objective = upload.objective.strip() if upload.objective else None
    if objective is not None and objective not in index:
        raise InvalidInput(
            f"objective column {objective!r} is not in the header (columns: {', '.join(header)})"
        )
    id_name = upload.id_column.strip() if upload.id_column else None
    if id_name is not None:
        if id_name not in index:
            raise InvalidInput(
                f"id column {id_name!r} is not in the header (columns: {', '.join(header)}); name the "
                "column that holds each row's sample id, or leave id_column out"
            )
        if id_name == objective:
            raise InvalidInput(f"the id column {id_name!r} cannot also be the objective column")
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
        if id_name is not None and id_name in names:
            raise InvalidInput(
                f"the id column {id_name!r} cannot also be a feature: ids are kept by the curator and never "
                "released; remove it from `features`"
            )
    else:
        names = [name for name in header if name not in (objective, id_name)]
    if not names:
        raise InvalidInput(
            "no feature columns: the CSV needs at least one column besides the objective and the id column"
        )
    mode = upload.objective_mode or ("column" if objective else "manual")
    if mode not in ("column", "manual"):
        raise InvalidInput(f'objective_mode must be "column" or "manual", got {mode!r}')
    if mode == "column" and objective is None:
        raise InvalidInput('objective_mode "column" needs an objective column (the form field `objective`)')
    return Columns(
        features=[index[name] for name in names],
        objective=index[objective] if objective else None,
        ids=index[id_name] if id_name is not None else None,
        mode=mode,
    )


def check_unique_ids(ids: Ids, column: str) -> None:
    """Every row's id differs from every other's; else a 422 naming the first data row that repeats an
    earlier row's id (by position: the id itself is not echoed)."""
    if ids.shape[0] < 2:
        return
    order = np.argsort(ids, kind="stable")  # equal ids stay in row order
    ranked = ids[order]
    same = np.flatnonzero(ranked[1:] == ranked[:-1])
    if same.size == 0:
        return
    later = order[same + 1]
    k = int(np.argmin(later))
    raise InvalidInput(
        f"data row {int(later[k]) + 1} repeats the id of data row {int(order[same[k]]) + 1} in the id column "
        f"{column!r}; every row needs its own id (fix the file, or leave id_column out)"
    )


def _check_upload_params(upload: DatasetUpload) -> None:
    if not upload.name.strip():
        raise InvalidInput("name must not be empty")
    if not math.isfinite(upload.noise_std) or upload.noise_std < 0:
        raise InvalidInput(f"noise_std must be a finite number >= 0, got {upload.noise_std!r}")
    if upload.epsilon_budget is not None:
        positive_finite(upload.epsilon_budget, "epsilon_budget")
    if upload.delta_budget is not None and not (0.0 < upload.delta_budget < 1.0):
        raise InvalidInput(f"delta_budget must lie strictly between 0 and 1, got {upload.delta_budget!r}")
    if upload.population is not None and not (0 < len(upload.population.strip()) <= 200):
        raise InvalidInput("population must be a name of 1 to 200 characters")
    if isinstance(upload.rows_per_person, bool) or not 1 <= upload.rows_per_person <= MAX_ROWS_PER_PERSON:
        raise InvalidInput(
            f"rows_per_person must be an integer from 1 to {MAX_ROWS_PER_PERSON}, "
            f"got {upload.rows_per_person!r}"
        )


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
    max_features: int,
    parse_workers: int = 1,
) -> Dataset:
    """Parse a CSV upload into a float64 feature array (+ outcome array) and record the dataset.

    The scaling is applied to the features before they are stored, so everything downstream (sigma_min,
    releases) works in the DP unit. The raw values are fingerprinted on the way (``fingerprint.py``) to
    find the population the rows belong to (``populations.resolve``). The files are committed to disk
    first; if the request's transaction then fails they are deleted again (``on_rollback``).
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
    columns = _resolve_columns(upload, header)
    feat_cols, obj_col, mode = columns.features, columns.objective, columns.mode
    feature_names = [header[j] for j in feat_cols]
    d = len(feat_cols)
    if d > max_features:
        raise PayloadTooLarge(
            f"the CSV has {d} feature columns; the limit is {max_features} (setting "
            "POBO_CURATOR_MAX_FEATURES): select fewer with the form field `features`, or raise the limit"
        )
    divisors: np.ndarray | None = None
    if spec.kind == "per_feature":
        assert spec.scales is not None
        unknown = [name for name in spec.scales if name not in feature_names]
        if unknown:
            raise InvalidInput(f"scaling names unknown feature(s): {', '.join(map(repr, unknown))}")
        divisors = np.array([spec.scales.get(name, 1.0) for name in feature_names])

    usecols = feat_cols + ([obj_col] if obj_col is not None else [])
    parser = ChunkParser(stream.header, usecols, columns.ids)
    id_blocks: list[Ids] = []
    ids_rel: str | None = None
    ids_sha: str | None = None
    feat_rel = store.new_relpath("datasets", "features")
    out_rel = store.new_relpath("datasets", "outcomes") if obj_col is not None else None
    feat_writer = store.stream_writer(feat_rel, d)
    out_writer = store.stream_writer(out_rel, None) if out_rel else None
    max_norm_sq = 0.0
    fingerprint = FingerprintBuilder(d)
    try:
        for values, ids in iter_rows(stream, parser, workers=parse_workers):
            if values.shape[0] == 0:
                continue
            if ids is not None:
                id_blocks.append(ids)
            feats = values[:, :d]
            fingerprint.add(feats)  # the raw values: the same people whatever the scaling
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
        if columns.ids is not None:
            all_ids = np.concatenate(id_blocks)
            id_blocks.clear()
            check_unique_ids(all_ids, header[columns.ids])
            ids_rel = store.new_relpath("datasets", "ids")
            ids_sha = store.save(ids_rel, all_ids, dtype=None)
            del all_ids
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
        store.committed(feat_rel, feat_sha)
        out_sha = out_writer.commit() if out_writer is not None else None
        if out_rel is not None and out_sha is not None:
            store.committed(out_rel, out_sha)
    except BaseException:
        feat_writer.abort()
        if out_writer is not None:
            out_writer.abort()
        store.delete(feat_rel)
        store.delete(out_rel)
        store.delete(ids_rel)
        raise

    def _remove_files() -> None:
        store.delete(feat_rel)
        store.delete(out_rel)
        store.delete(ids_rel)

    on_rollback(session, _remove_files)
    prints = fingerprint.result()
    signatures = _signatures(
        store,
        (feat_rel, feat_sha),
        None if out_rel is None or out_sha is None else (out_rel, out_sha),
        feature_names,
        header[obj_col] if obj_col is not None else None,
        spec,
    )
    population, reason = populations.resolve(
        session,
        declared=upload.population.strip() if upload.population else None,
        acknowledge_distinct_people=upload.acknowledge_distinct_people,
        fingerprint=prints,
        signatures=signatures,
        epsilon_budget=upload.epsilon_budget,
        delta_budget=upload.delta_budget,
        default_epsilon_budget=DEFAULT_EPSILON_BUDGET,
    )
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
        population_id=population.id,
        population_reason=reason,
        rows_hash=prints.rows,
        column_hashes=prints.columns,
        column_signatures=[c.to_json() for c in signatures],
        rows_per_person=int(upload.rows_per_person),
        acknowledged_distinct_people=bool(upload.acknowledge_distinct_people),
        id_column=header[columns.ids] if columns.ids is not None else None,
        ids_path=ids_rel,
        ids_sha256=ids_sha,
    )
    repo.add(session, dataset)
    populations.attach_to_reference(session, population, dataset)  # its factors, and the relation's growth
    session.flush()
    return dataset


def _signatures(
    store: ArrayStore,
    features: tuple[str, str],
    outcomes: tuple[str, str] | None,
    names: list[str],
    outcome: str | None,
    spec: ScalingSpec,
) -> list[ColumnSignature]:
    """The column signatures of the stored arrays (``fingerprint.column_signatures``): standardising makes
    them the same for the scaled and the raw values; the standard deviations come back in raw units."""
    X = store.load(*features)
    y = store.load(*outcomes) if outcomes is not None else None
    factors = [1.0] * len(names)
    if spec.kind == "per_feature" and spec.scales is not None:
        factors = [float(spec.scales.get(name, 1.0)) for name in names]
    try:
        return column_signatures(X, names, factors, y, outcome)
    finally:
        del X, y


def get_dataset(session: Session, dataset_id: int) -> Dataset:
    dataset = repo.get_dataset(session, dataset_id)
    if dataset is None:
        raise NotFound(f"dataset {dataset_id} does not exist")
    return dataset


def live_dataset(session: Session, dataset_id: int) -> Dataset:
    """The dataset, if it exists and was not erased (an erased one is a 410: its data will not return)."""
    dataset = get_dataset(session, dataset_id)
    if dataset.erased_at is not None:
        raise Gone(f"dataset {dataset_id} was erased")
    return dataset


def list_datasets(session: Session) -> Sequence[Dataset]:
    return repo.list_datasets(session)


def views(session: Session, datasets: Sequence[Dataset]) -> list[DatasetPublic]:
    """Datasets with their population's budget and spending."""
    pops = {p.id: p for p in repo.list_populations(session)}
    spent = repo.ledger_totals_by_population(session)
    return [
        dataset_public(ds, pops[ds.population_id], spent.get(ds.population_id, (0.0, 0.0))) for ds in datasets
    ]


def view(session: Session, dataset: Dataset) -> DatasetPublic:
    population = repo.get_population(session, dataset.population_id)
    assert population is not None
    return dataset_public(dataset, population, repo.ledger_totals(session, population.id))


def sweep_orphans(db: Database, store: ArrayStore, min_age_seconds: float = 3600.0) -> int:
    """Delete array files that no database row refers to (leftovers of a crash mid-write) once they are
    ``min_age_seconds`` old (younger ones may belong to a write still in flight in another process)."""
    with db.session(write=False) as session:
        referenced = repo.all_array_paths(session)
    return store.sweep(referenced, min_age_seconds=min_age_seconds)
