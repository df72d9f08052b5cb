"""Erasing a dataset (``DELETE /v1/datasets/{id}``): its rows, outcomes, sample ids and every array derived
from them leave the data dir; the dataset, its releases and oracles stay as tombstones (``erased_at``).

Order, so that a crash leaves no half state:

1. One write transaction locks the dataset's population (as a release or an oracle does when it spends
   from it, so neither commits on an erased dataset), checks the live grants (a 409 unless ``force``),
   marks the dataset, its releases and oracles erased and drops the database values derived from its rows
   (``erasure_repository.mark_erased``). From its commit on, no path reads the files.
2. The files are unlinked. A crash before they all are leaves files no live row refers to:
   ``sweep_erased`` removes them at the next start, before the service answers.

The ledger, the per-person output charges, the access log and the query logs stay, and the hash chains
still verify: a link covers an answer as it was *sent* (``y``), which stays; the raw measured values kept
beside privatised answers (``y_raw``) are not covered and are dropped.
"""

from __future__ import annotations

import logging

from sqlalchemy.orm import Session

from curator_service import erasure_repository as erepo
from curator_service import repository as repo
from curator_service.db import Database
from curator_service.exceptions import Conflict
from curator_service.models import Dataset, utcnow
from curator_service.services.datasets import get_dataset
from curator_service.storage import ArrayStore

logger = logging.getLogger(__name__)


def live_holders(session: Session, dataset_id: int) -> list[erepo.Holder]:
    """The grants of partners not revoked on the dataset's releases and oracles (what makes erasing a 409)."""
    return erepo.live_holders(session, dataset_id)


def erase_dataset(db: Database, store: ArrayStore, dataset_id: int, *, force: bool = False) -> Dataset:
    """Erase the dataset (idempotent: erasing an erased dataset removes any file left and changes nothing)."""
    with db.session(write=True) as session:
        dataset = get_dataset(session, dataset_id)
        repo.lock_population(session, dataset.population_id)
        session.refresh(dataset)
        holders = erepo.live_holders(session, dataset_id)
        if holders and not force and dataset.erased_at is None:
            held = "; ".join(
                f"partner {h.partner_id} ({h.partner_name}) on {h.kind} {h.target_id}" for h in holders
            )
            raise Conflict(
                f"dataset {dataset_id} is still granted to partners who have not been revoked: {held}. "
                "Revoke them first, or erase with ?force=true (their grants then answer 410 Gone)"
            )
        paths = erepo.array_paths(session, [dataset_id])
        if dataset.erased_at is None:
            erepo.mark_erased(session, dataset_id, utcnow())
        session.commit()
        session.refresh(dataset)
        session.expunge(dataset)
    for path in sorted(paths):
        store.delete(path)
    logger.info("erased dataset %d (%d array file(s))", dataset_id, len(paths))
    return dataset


def sweep_erased(db: Database, store: ArrayStore) -> int:
    """Remove the files of erased datasets a crash left behind (start-up; whatever their age)."""
    with db.session(write=False) as session:
        paths = erepo.array_paths(session, erepo.erased_dataset_ids(session))
    left = [p for p in sorted(paths) if store.abspath(p).exists()]
    for path in left:
        store.delete(path)
    if left:
        logger.info("removed %d file(s) of erased datasets", len(left))
    return len(left)
