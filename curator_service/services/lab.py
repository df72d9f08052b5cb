"""The lab's use cases for ``manual`` datasets: which samples to measure, and measurements in bulk.

* **Sample ids.** An upload may name an id column (``id_column``): the ids are stored beside the features
  (``Dataset.ids_path``, a fixed-width UTF-8 .npy) and looked up here, by row for the lab's list and by id
  for a bulk upload. They never reach a partner, a release or a log line.
* **The list** (``GET /v1/queries``): pending queries across releases, each with its sample id.
* **Bulk entry** (``POST /v1/queries/results``): a CSV of measurements (``bulkcsv.py`` reads it), each line
  naming its query by ``query_id``, ``sample_id`` or ``index`` (row; with a ``release_id``). A line answers
  every pending query about its sample (several partners or releases may ask about one row). All lines are
  checked and posted in one transaction: any bad line is a 4xx naming the line, and nothing is written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy.orm import Session

from curator_service import lab_repository as lab_repo
from curator_service import repository as repo
from curator_service.csvparse import Ids
from curator_service.exceptions import Conflict, Gone, InvalidInput
from curator_service.models import Dataset, Query
from curator_service.services import outputs
from curator_service.services.bulkcsv import Measurement
from curator_service.services.queries import already_complete
from curator_service.storage import ArrayStore
from shared.protocol.schemas import LabQueryPublic, PostedLine

__all__ = ["SampleIds", "lab_queries", "post_measurements"]

#: (line, release id) -> the release's ``manual`` dataset (a 4xx naming the line otherwise).
DatasetOfRelease = Callable[[int, int], Dataset]


class SampleIds:
    """The sample ids of datasets, loaded (memory-mapped) once per use."""

    def __init__(self, store: ArrayStore) -> None:
        self.store = store
        self._loaded: dict[int, Ids | None] = {}

    def of(self, dataset: Dataset) -> Ids | None:
        if dataset.id not in self._loaded:
            ids = None
            if dataset.ids_path is not None and dataset.ids_sha256 is not None:
                ids = self.store.load(dataset.ids_path, dataset.ids_sha256)
            self._loaded[dataset.id] = ids
        return self._loaded[dataset.id]

    def sample_id(self, dataset: Dataset, index: int) -> str | None:
        ids = self.of(dataset)
        if ids is None or not 0 <= index < ids.shape[0]:
            return None
        return bytes(ids[index]).decode("utf-8")

    def rows_of(self, dataset: Dataset, wanted: Sequence[str]) -> dict[str, int]:
        """The row of each id of ``wanted`` the dataset has (ids it does not have are left out)."""
        ids = self.of(dataset)
        if ids is None or not wanted:
            return {}
        keys = np.array([w.encode("utf-8") for w in wanted], dtype=np.bytes_)
        rows = np.flatnonzero(np.isin(ids, keys))
        return {bytes(ids[i]).decode("utf-8"): int(i) for i in rows}


def lab_queries(
    session: Session,
    store: ArrayStore,
    *,
    status: str,
    release_id: int | None = None,
    dataset_id: int | None = None,
    after_id: int | None = None,
    limit: int,
) -> list[LabQueryPublic]:
    """Queries of ``manual`` datasets with ``status`` across releases, oldest first, with sample ids."""
    rows = lab_repo.lab_queries(
        session, status=status, release_id=release_id, dataset_id=dataset_id, after_id=after_id, limit=limit
    )
    ids = SampleIds(store)
    changed = lab_repo.corrections_of(session, [q.id for q, *_ in rows])
    return [
        LabQueryPublic(
            id=q.id,
            release_id=q.release_id,
            dataset_id=d.id,
            dataset_name=d.name,
            index=q.row_index,
            sample_id=ids.sample_id(d, q.row_index),
            partner_id=p.id,
            partner_name=p.name,
            status=q.status,  # type: ignore[arg-type]
            y=q.y,
            created_at=q.created_at,
            completed_at=q.completed_at,
            delivered_at=q.delivered_at,
            corrections=len(changed.get(q.id, [])),
        )
        for q, _r, d, p in rows
    ]


# ---------------------------------------------------------------------------------------------- bulk


@dataclass(frozen=True)
class _Target:
    """A measurement line resolved: the queries it answers, on one dataset."""

    line: int
    y: float
    dataset: Dataset
    queries: list[Query]


def post_measurements(
    session: Session, store: ArrayStore, measurements: Sequence[Measurement]
) -> tuple[list[PostedLine], list[Query]]:
    """Resolve every line to the pending queries it answers, check them all, then post them all (the
    caller's transaction commits once, or rolls everything back)."""
    targets = _resolve(session, store, measurements)
    seen: dict[int, int] = {}
    for t in targets:
        for q in t.queries:
            if q.id in seen:
                raise InvalidInput(
                    f"line {t.line} answers query {q.id} again (line {seen[q.id]} did): one value per query; "
                    "nothing was posted"
                )
            seen[q.id] = t.line
    answered: list[Query] = []
    for t in targets:
        for q in t.queries:
            if not outputs.record_answer(session, q, t.dataset, t.y):  # completed meanwhile
                raise Conflict(f"line {t.line}: {already_complete(session, q)}; nothing was posted")
            fresh = repo.refresh_query(session, q.id)
            assert fresh is not None
            answered.append(fresh)
    lines = [PostedLine(line=t.line, query_ids=[q.id for q in t.queries]) for t in targets]
    return lines, answered


def _resolve(session: Session, store: ArrayStore, measurements: Sequence[Measurement]) -> list[_Target]:
    by_query = [m for m in measurements if m.query_id is not None]
    queries = lab_repo.get_queries(session, [m.query_id for m in by_query if m.query_id is not None])
    datasets: dict[int, Dataset] = {}
    release_datasets: dict[int, Dataset] = {}

    def dataset_of_release(line: int, release_id: int) -> Dataset:
        if release_id not in release_datasets:
            release = repo.get_release(session, release_id)
            if release is None:
                raise InvalidInput(f"line {line}: release {release_id} does not exist")
            dataset = repo.get_dataset(session, release.dataset_id)
            assert dataset is not None
            if dataset.erased_at is not None:
                raise Gone(f"line {line}: release {release_id} was erased with its dataset {dataset.id}")
            if dataset.objective_mode != "manual":
                raise InvalidInput(
                    f"line {line}: release {release_id} is of dataset {dataset.id}, whose outcomes come from "
                    "its objective column; measurements are posted only for 'manual' datasets"
                )
            release_datasets[release_id] = datasets.setdefault(dataset.id, dataset)
        return release_datasets[release_id]

    rows: dict[int, tuple[Measurement, Dataset, int]] = {}  # line -> (measurement, dataset, row)
    by_sample = [m for m in measurements if m.sample_id is not None]
    located = _locate_samples(session, store, by_sample, dataset_of_release)
    targets: dict[int, _Target] = {}
    for m in measurements:
        if m.query_id is not None:
            targets[m.line] = _by_query_id(session, m, queries.get(m.query_id), dataset_of_release)
        elif m.sample_id is not None:
            rows[m.line] = (m, *located[m.line])
        else:
            assert m.index is not None
            if m.release_id is None:
                raise InvalidInput(
                    f"line {m.line}: an index names a row of a release's dataset: add a release_id column or "
                    "give the form field release_id"
                )
            dataset = dataset_of_release(m.line, m.release_id)
            if m.index >= dataset.n:
                raise InvalidInput(
                    f"line {m.line}: index {m.index} is out of range: dataset {dataset.id} has n = "
                    f"{dataset.n} rows (valid 0..{dataset.n - 1})"
                )
            rows[m.line] = (m, dataset, m.index)
    pending = _pending_by_row(session, rows.values())
    for line, (m, dataset, row) in rows.items():
        found = pending.get((dataset.id, m.release_id, row), [])
        if not found:
            about = "this sample" if m.sample_id is not None else f"row {row}"
            scope = f"release {m.release_id}" if m.release_id is not None else f"dataset {dataset.id}"
            raise InvalidInput(
                f"line {line}: no query of {scope} is waiting for a measurement of {about} (row {row}): "
                "it was answered already or never asked; remove the line (GET /v1/queries?status=pending "
                "lists what is waiting)"
            )
        targets[line] = _Target(line, m.y, dataset, found)
    return [targets[m.line] for m in measurements]


def _by_query_id(
    session: Session, m: Measurement, query: Query | None, dataset_of_release: DatasetOfRelease
) -> _Target:
    assert m.query_id is not None
    if query is None:
        raise InvalidInput(f"line {m.line}: query {m.query_id} does not exist")
    if m.release_id is not None and query.release_id != m.release_id:
        raise InvalidInput(
            f"line {m.line}: query {m.query_id} is of release {query.release_id}, "
            f"not of release {m.release_id}"
        )
    dataset = dataset_of_release(m.line, query.release_id)
    if query.status == "complete":
        raise Conflict(f"line {m.line}: {already_complete(session, query)}; nothing was posted")
    if query.source_query_id is not None:
        raise InvalidInput(
            f"line {m.line}: query {query.id} repeats query {query.source_query_id}'s row and is answered "
            f"with its measurement: post the value for query {query.source_query_id} instead"
        )
    return _Target(m.line, m.y, dataset, [query])


def _locate_samples(
    session: Session,
    store: ArrayStore,
    by_sample: Sequence[Measurement],
    dataset_of_release: DatasetOfRelease,
) -> dict[int, tuple[Dataset, int]]:
    """line -> (dataset, row) of every sample-id line: in the line's release's dataset, or in the one
    ``manual`` dataset with ids that has the id (an id found in several needs a release_id)."""
    out: dict[int, tuple[Dataset, int]] = {}
    if not by_sample:
        return out
    ids = SampleIds(store)
    unscoped = [m for m in by_sample if m.release_id is None]
    candidates = lab_repo.datasets_with_ids(session) if unscoped else []
    wanted = sorted({m.sample_id for m in unscoped if m.sample_id is not None})
    found_in: dict[str, list[tuple[Dataset, int]]] = {}
    for dataset in candidates:
        for sid, row in ids.rows_of(dataset, wanted).items():
            found_in.setdefault(sid, []).append((dataset, row))
    for m in by_sample:
        assert m.sample_id is not None
        if m.release_id is not None:
            dataset = dataset_of_release(m.line, m.release_id)
            if dataset.ids_path is None:
                raise InvalidInput(
                    f"line {m.line}: dataset {dataset.id} (release {m.release_id}) was uploaded without an "
                    "id column: name the row by index or the query by query_id"
                )
            found = ids.rows_of(dataset, [m.sample_id]).get(m.sample_id)
            if found is None:
                raise InvalidInput(
                    f"line {m.line}: dataset {dataset.id} (release {m.release_id}) has no row with this "
                    "sample id"
                )
            out[m.line] = (dataset, found)
            continue
        places = found_in.get(m.sample_id, [])
        if not places:
            raise InvalidInput(
                f"line {m.line}: no manual dataset with an id column has this sample id; check it, or "
                "name the query by query_id"
            )
        if len(places) > 1:
            listed = ", ".join(str(d.id) for d, _ in places)
            raise InvalidInput(
                f"line {m.line}: this sample id is in datasets {listed}: add a release_id column (or the "
                "form field release_id) to say which"
            )
        out[m.line] = places[0]
    return out


def _pending_by_row(
    session: Session, rows: Iterable[tuple[Measurement, Dataset, int]]
) -> dict[tuple[int, int | None, int], list[Query]]:
    """(dataset, release or None, row) -> the pending queries about that row (of that release, or of every
    release of the dataset), for every (measurement, dataset, row) in ``rows``."""
    wanted: dict[tuple[int, int | None], set[int]] = {}
    for m, dataset, row in rows:
        wanted.setdefault((dataset.id, m.release_id), set()).add(row)
    out: dict[tuple[int, int | None, int], list[Query]] = {}
    for (dataset_id, release_id), wanted_rows in wanted.items():
        for q in lab_repo.pending_for_rows(session, dataset_id, sorted(wanted_rows), release_id):
            out.setdefault((dataset_id, release_id, q.row_index), []).append(q)
    return out
