"""Datasets: CSV upload, metadata, privacy report, ledger (admin only)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, File, Form, Query, UploadFile

from curator_service.api.deps import AdminDep, ComponentsDep, RowId, SessionDep
from curator_service.services import datasets as dataset_service
from curator_service.services import erasure as erasure_service
from curator_service.services import populations as population_service
from curator_service.services import privacy as privacy_service
from shared.protocol.schemas import (
    DELTA_MIN,
    EPSILON_MAX,
    EPSILON_MIN,
    DatasetPublic,
    DatasetsPublic,
    LedgerPublic,
    PrivacyReport,
)

router = APIRouter(tags=["datasets"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "Missing or invalid token."},
    403: {"description": "A partner token (this endpoint is admin-only)."},
}


@router.post(
    "/v1/datasets",
    status_code=201,
    response_model=DatasetPublic,
    summary="Upload a CSV dataset (streamed; header row required)",
    description="The file is streamed to disk and parsed in chunks by `POBO_CURATOR_CSV_PARSE_WORKERS` "
    "processes; the features (and the outcome column) are stored as float64 arrays, an `id_column`'s ids "
    "apart. **Expected time:** about half a minute to a minute per GB of CSV on a 2-CPU server, plus the "
    "transfer. Measured on such a machine over the loopback: a 159 MB file (800,000 rows, 10 features, an "
    "id column) took 3.7-5.3 s when the machine was otherwise idle (23-33 s per GB; 3.8-4.1 s without "
    "the id column) and 8-12 s while other jobs kept both CPUs busy (52-76 s per GB). Over a network add "
    "the transfer (1 GB at 100 Mbit/s: about 80 s). The console's upload form shows the transfer's "
    "progress. A file that is not comma-separated (semicolons, tabs) is refused with a 422 that names the "
    "delimiter it seems to use.",
    responses={
        **_ERRORS,
        413: {
            "description": "The CSV is larger than POBO_CURATOR_MAX_UPLOAD_BYTES, or has more feature "
            "columns than POBO_CURATOR_MAX_FEATURES."
        },
        422: {"description": "A bad cell (named by data row, line and column), a bad column selection, ..."},
    },
)
def create_dataset(
    _admin: AdminDep,
    session: SessionDep,
    components: ComponentsDep,
    file: Annotated[
        UploadFile,
        File(
            description="CSV, UTF-8, comma-separated, header row first (a semicolon- or tab-separated file "
            "is refused with a 422 that says so)."
        ),
    ],
    name: Annotated[str, Form(min_length=1, max_length=200, examples=["diabetes-cohort-2024"])],
    features: Annotated[
        str | None,
        Form(
            description="Comma-separated feature column names (default: every column but `objective`). "
            "Unselected columns may hold anything (e.g. an id).",
            examples=["age,bmi,bp"],
        ),
    ] = None,
    objective: Annotated[
        str | None,
        Form(description="Outcome column (stored apart, never released).", examples=["progression"]),
    ] = None,
    objective_mode: Annotated[
        Literal["column", "manual"] | None,
        Form(
            description='"column" (default when objective is given): answer queries from the column; '
            '"manual" (default otherwise): the curator posts each measured outcome.',
            examples=["column"],
        ),
    ] = None,
    noise_std: Annotated[
        float,
        Form(ge=0, description="Std of the Gaussian noise added to each column outcome.", examples=[0.0]),
    ] = 0.0,
    scaling: Annotated[
        str,
        Form(
            description='How features are scaled before release: "none" (the curator\'s units are the DP '
            "unit), a JSON object of per-feature scales (column / scale; declared, keeps the guarantee), "
            'or "max_norm:<c>" (data-dependent, outside the formal guarantee).',
            examples=["none", "max_norm:25", '{"age": 10, "bmi": 5}'],
        ),
    ] = "none",
    epsilon_budget: Annotated[
        float | None,
        Form(
            gt=0,
            description="Total epsilon of all releases of a NEW population (default 10). Joining an existing "
            "population: leave it out (a different value is a 409).",
            examples=[10.0],
        ),
    ] = None,
    delta_budget: Annotated[
        float | None,
        Form(
            gt=0,
            lt=1,
            description="Total delta of a NEW population (default min(1e-3, 0.1 / n)); as epsilon_budget "
            "otherwise.",
            examples=[1e-3],
        ),
    ] = None,
    population: Annotated[
        str | None,
        Form(
            min_length=1,
            max_length=200,
            description="Name of the population (the people) these rows belong to. Datasets of one "
            "population share one budget. The fingerprint check runs either way: rows that share a column "
            "with an earlier upload of as many rows (reordered, renamed, in other units, a subset, superset "
            "or overlap of its columns, the same outcomes) join its population; declaring another "
            "population for them is a 409 unless acknowledge_distinct_people is true.",
            examples=["ward-3 patients 2024"],
        ),
    ] = None,
    acknowledge_distinct_people: Annotated[
        bool,
        Form(
            description="With a declared population: these are different people, although the fingerprint "
            "matches an upload of another population (recorded on the dataset).",
            examples=[False],
        ),
    ] = False,
    rows_per_person: Annotated[
        int,
        Form(
            ge=1,
            le=10_000,
            description="At most this many rows of one person in this dataset (default 1). Group privacy: "
            "releases are charged as a change of norm sqrt(k), output answers k times per person.",
            examples=[1],
        ),
    ] = 1,
    id_column: Annotated[
        str | None,
        Form(
            min_length=1,
            max_length=200,
            description="Column of sample ids (text, non-empty, unique, at most 200 bytes): kept by the "
            "curator so the lab sees which sample each query is about (`GET /v1/queries`), left out of the "
            "features, never released, never shown to a partner.",
            examples=["sample_id"],
        ),
    ] = None,
) -> DatasetPublic:
    upload = dataset_service.DatasetUpload(
        name=name,
        features=features,
        objective=objective,
        objective_mode=objective_mode,
        noise_std=noise_std,
        scaling=scaling,
        epsilon_budget=epsilon_budget,
        delta_budget=delta_budget,
        population=population,
        acknowledge_distinct_people=acknowledge_distinct_people,
        rows_per_person=rows_per_person,
        id_column=id_column,
    )
    dataset = dataset_service.create_dataset(
        session,
        components.store,
        upload,
        file.file,
        size=file.size,
        max_upload_bytes=components.settings.max_upload_bytes,
        max_features=components.settings.max_features,
        parse_workers=components.settings.csv_parse_workers,
    )
    return dataset_service.view(session, dataset)


@router.get(
    "/v1/datasets", response_model=DatasetsPublic, summary="List datasets (metadata only)", responses=_ERRORS
)
def list_datasets(_admin: AdminDep, session: SessionDep) -> DatasetsPublic:
    data = dataset_service.views(session, dataset_service.list_datasets(session))
    return DatasetsPublic(data=data, count=len(data))


@router.get(
    "/v1/datasets/{dataset_id}",
    response_model=DatasetPublic,
    summary="One dataset's metadata (never row data)",
    responses={**_ERRORS, 404: {"description": "No such dataset."}},
)
def get_dataset(dataset_id: RowId, _admin: AdminDep, session: SessionDep) -> DatasetPublic:
    return dataset_service.view(session, dataset_service.get_dataset(session, dataset_id))


@router.delete(
    "/v1/datasets/{dataset_id}",
    response_model=DatasetPublic,
    summary="Erase a dataset: its rows, outcomes, sample ids and every file derived from them",
    description="The features, outcomes and sample ids, and the Z of every release of the dataset, leave the "
    "data dir; the dataset, its releases and gradient oracles stay as tombstones (`erased_at`), so the "
    "ledger, the access log and the query logs (hash chains included) keep every reference and still "
    "verify. The query logs keep each answer as it was sent to its partner (the chain's links cover it); "
    "raw measured values kept beside privatised answers are dropped. Erasing an erased dataset answers "
    "200 again. After an erasure, a partner's request on one of its releases or gradient oracles is a 410 "
    "Gone (`release N was erased: ...`), and so is any admin action that needs its data.",
    responses={
        **_ERRORS,
        404: {"description": "No such dataset."},
        409: {
            "description": "A partner that is not revoked still holds a grant on one of its releases or "
            "gradient oracles (the message names them); revoke them, or pass `force=true`."
        },
    },
)
def erase_dataset(
    dataset_id: RowId,
    _admin: AdminDep,
    components: ComponentsDep,
    force: Annotated[
        bool,
        Query(description="Erase although partners still hold grants on it (they then get 410 Gone)."),
    ] = False,
) -> DatasetPublic:
    erasure_service.erase_dataset(components.db, components.store, dataset_id, force=force)
    with components.db.session(write=False) as session:
        return dataset_service.view(session, dataset_service.get_dataset(session, dataset_id))


@router.get(
    "/v1/datasets/{dataset_id}/privacy",
    response_model=PrivacyReport,
    summary="Privacy report: what a release at (epsilon, delta) protects, in your units; budget left",
    description="Curator-private. For the default Gaussian release: the noise, the guarantee in one "
    "paragraph, the change of each feature the unit covers (in the curator's units), the epsilon protecting "
    "larger changes, what happens to outcomes, and warnings (delta >= 1/n, data-dependent scaling, budget). "
    "For the paper's Algorithm 1 (po-gp-ucb, no formal guarantee): why, and its diagnostics: sigma_min (the "
    "smallest singular value of the centred, scaled features, cached), the r -> omega -> feasible table "
    "and the recommended r (data-dependent, outside any guarantee).",
    responses={
        **_ERRORS,
        404: {"description": "No such dataset."},
        410: {"description": "The dataset was erased: `dataset N was erased`."},
    },
)
def privacy(
    dataset_id: RowId,
    _admin: AdminDep,
    session: SessionDep,
    components: ComponentsDep,
    epsilon: Annotated[
        float,
        Query(ge=EPSILON_MIN, le=EPSILON_MAX, description="epsilon of the release you plan.", examples=[1.0]),
    ],
    delta: Annotated[
        float, Query(ge=DELTA_MIN, lt=1, description="delta of the release you plan.", examples=[1e-4])
    ],
    r_max: Annotated[int, Query(ge=1, le=10_000, description="Largest r in the table.")] = 100,
) -> PrivacyReport:
    return privacy_service.privacy_report(
        session, components.db, components.store, dataset_id, epsilon=epsilon, delta=delta, r_max=r_max
    )


@router.get(
    "/v1/datasets/{dataset_id}/ledger",
    response_model=LedgerPublic,
    summary="The ledger of the dataset's population (every dataset of it spends from one budget)",
    responses={**_ERRORS, 404: {"description": "No such dataset."}},
)
def ledger(dataset_id: RowId, _admin: AdminDep, session: SessionDep) -> LedgerPublic:
    dataset = dataset_service.get_dataset(session, dataset_id)
    return population_service.ledger_public(session, dataset.population_id)
