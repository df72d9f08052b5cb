"""The queries of a dataset's erasure (``services.erasure``): who still holds it, what files it has, and the
one UPDATE per table that turns it into a tombstone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from curator_service.models import (
    Dataset,
    GradientOracle,
    Grant,
    OracleGrant,
    Partner,
    Query,
    QueryCorrection,
    Release,
)


@dataclass(frozen=True)
class Holder:
    """A live grant on something derived from the dataset: a release or a gradient oracle."""

    partner_id: int
    partner_name: str
    kind: str  # "release" | "gradient oracle"
    target_id: int


def live_holders(session: Session, dataset_id: int) -> list[Holder]:
    """Grants of partners that are not revoked, on the dataset's releases and gradient oracles."""
    releases = session.execute(
        select(Partner.id, Partner.name, Grant.release_id)
        .join(Grant, Grant.partner_id == Partner.id)
        .join(Release, Release.id == Grant.release_id)
        .where(Release.dataset_id == dataset_id, Partner.revoked_at.is_(None))
        .order_by(Grant.release_id, Partner.id)
    ).all()
    oracles = session.execute(
        select(Partner.id, Partner.name, OracleGrant.oracle_id)
        .join(OracleGrant, OracleGrant.partner_id == Partner.id)
        .join(GradientOracle, GradientOracle.id == OracleGrant.oracle_id)
        .where(GradientOracle.dataset_id == dataset_id, Partner.revoked_at.is_(None))
        .order_by(OracleGrant.oracle_id, Partner.id)
    ).all()
    return [Holder(int(p), str(name), "release", int(t)) for p, name, t in releases] + [
        Holder(int(p), str(name), "gradient oracle", int(t)) for p, name, t in oracles
    ]


def array_paths(session: Session, dataset_ids: Sequence[int]) -> set[str]:
    """Every array file of these datasets: features, outcomes, sample ids and their releases' Z."""
    if not dataset_ids:
        return set()
    paths: set[str] = set()
    for row in session.execute(
        select(Dataset.features_path, Dataset.outcomes_path, Dataset.ids_path).where(
            Dataset.id.in_(list(dataset_ids))
        )
    ):
        paths.update(p for p in row if p)
    paths.update(session.scalars(select(Release.z_path).where(Release.dataset_id.in_(list(dataset_ids)))))
    return paths


def erased_dataset_ids(session: Session) -> list[int]:
    return list(
        session.scalars(select(Dataset.id).where(Dataset.erased_at.is_not(None)).order_by(Dataset.id))
    )


def mark_erased(session: Session, dataset_id: int, at: datetime) -> None:
    """Tombstone the dataset, its releases and oracles; drop what the database holds derived from its rows.

    Dropped: the fingerprints (``rows_hash``, ``column_hashes``, ``column_signatures``), the cached
    ``sigma_min``, and the raw measured outcomes kept beside privatised answers (``y_raw``,
    ``previous_y_raw``) -- none of them is covered by a hash chain. Kept: every answer as it was sent to a
    partner (``y``, ``previous_y``), which the query log's links cover (docs/operations.md, "Erasing a
    dataset")."""
    release_ids = select(Release.id).where(Release.dataset_id == dataset_id).scalar_subquery()
    session.execute(
        update(Dataset)
        .where(Dataset.id == dataset_id)
        .values(erased_at=at, rows_hash=None, column_hashes=None, column_signatures=None, sigma_min=None)
    )
    session.execute(
        update(Release)
        .where(Release.dataset_id == dataset_id, Release.erased_at.is_(None))
        .values(erased_at=at, sigma_min=None)
    )
    session.execute(
        update(GradientOracle)
        .where(GradientOracle.dataset_id == dataset_id, GradientOracle.erased_at.is_(None))
        .values(erased_at=at)
    )
    session.execute(update(Query).where(Query.release_id.in_(release_ids)).values(y_raw=None))
    session.execute(
        update(QueryCorrection)
        .where(QueryCorrection.release_id.in_(release_ids))
        .values(previous_y_raw=None, y_raw=None)
    )
