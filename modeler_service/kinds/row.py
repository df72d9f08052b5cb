"""The ``row`` request kind: the outcome of one row of a curator release, by index (PO-GP-UCB's query;
``POST /v1/releases/{id}/queries``, answered by a ``QueryPublic``, at once or, for a ``manual`` dataset,
when the lab posts the measurement). A study of a row strategy runs on a release: its public parameters
and its rows Z, downloaded once, sha256-checked and stored with the study."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy.orm import Session

from modeler_service import repository as repo
from modeler_service.exceptions import StorageError, Unprocessable, UpstreamError
from modeler_service.grants import fit_to_grant, grant_problem, needs_grant
from modeler_service.kinds.base import PlannedRequest, Recorded, RequestKind, Services, StudyFacts
from modeler_service.models import Study
from modeler_service.schemas import BestPoint, ReleaseInfo, RoundQuery, StudyCreate
from modeler_service.upstream import upstream
from shared.bo.backend import uses_dask
from shared.bo.strategies import Answer, RowRequest, Strategy, StrategyParams
from shared.errors import ROW_UNAFFORDABLE, InputDataError, StrategyError
from shared.privacy.rng import os_entropy_rng
from shared.protocol.client import CuratorClient, CuratorError, ReleaseIntegrityError, npy_sha256
from shared.protocol.schemas import PartnerPublic, QueryPublic

log = logging.getLogger("pobo.modeler")

#: The release's public parameters a study keeps, as ``release_<name>`` columns.
RELEASE_FIELDS = ("epsilon", "delta", "mechanism", "formal_guarantee", "noise_std", "lift", "omega")


def _quota_left(me: PartnerPublic) -> tuple[int, str]:
    left = me.max_queries - me.queries_used
    quota = f"max_queries {me.max_queries}, {me.queries_used} used"
    return left, f"{left} queries left of this partner token's quota ({quota})"


class RowKind(RequestKind):
    name = "row"
    runs_on = "release"

    # ------------------------------------------------------------------------------------- the study

    def create(
        self,
        session: Session,
        services: Services,
        body: StudyCreate,
        strategy: type[Strategy[Any, Any]],
        params: StrategyParams,
    ) -> Study:
        """Fetch the release's public parameters and Z (sha256-verified, stored atomically), then the study
        (for a strategy that assumes something of the grant, the grant is read and checked first)."""
        if body.release_id is None:  # StudyCreate checks it; for the type checker
            raise Unprocessable(f"strategy {body.strategy!r} runs on a curator release: give release_id")
        study_id = uuid.uuid4().hex
        token = body.curator_token.get_secret_value()
        client = services.client_factory(body.curator_url, token)
        what = f"release {body.release_id}"
        data_dir = services.data_dir
        (data_dir / "releases").mkdir(parents=True, exist_ok=True)
        z_file = Path("releases") / f"study-{study_id}.npy"
        try:
            release = client.get_release(body.release_id)
            me = client.get_partner()
            left, what_left = _quota_left(me)
            if body.iterations > left:
                raise Unprocessable(
                    f"iterations must be <= the {what_left}, got {body.iterations}: ask for at most {left} "
                    f"iterations, or ask the curator to raise max_queries (PATCH /v1/partners/{me.id})"
                )
            if needs_grant(strategy, params, body.iterations):
                problem = grant_problem(strategy, params, body.iterations, me.output_privacy)
                if problem is not None:
                    raise Unprocessable(problem)
            # what the study left out and the grant says (e.g. GP-UCB's noise floor under output privacy)
            params = fit_to_grant(strategy, params, me.output_privacy)
            # resumed with a range request if the connection drops mid-body; the file name is this
            # study's, so a failed download leaves no partial behind (no later call would continue it)
            digest = client.download_release_rows(
                body.release_id, data_dir / z_file, expected_sha256=release.sha256, keep_partial=False
            )
        except ReleaseIntegrityError as exc:
            raise UpstreamError(f"{what}: {exc.detail}") from exc
        except CuratorError as exc:
            raise upstream(exc, what) from exc
        finally:
            client.close()
        Z = np.load(data_dir / z_file, mmap_mode="r")
        n, r = int(Z.shape[0]), int(Z.shape[1])
        if n != release.n or r != release.r:
            (data_dir / z_file).unlink(missing_ok=True)
            raise UpstreamError(
                f"{what}: rows have shape {n} x {r}, but the release says {release.n} x {release.r}"
            )
        rng = np.random.default_rng(body.seed) if body.seed is not None else os_entropy_rng()
        try:
            state = strategy.initial_state(params, n=n, budget=body.iterations, rng=rng)
        except InputDataError as exc:
            (data_dir / z_file).unlink(missing_ok=True)
            raise Unprocessable(str(exc)) from exc
        study = Study(
            id=study_id,
            curator_url=body.curator_url.rstrip("/"),
            curator_token_enc=services.encrypt(token),
            release_id=body.release_id,
            n=n,
            r=r,
            **{f"release_{key}": getattr(release, key) for key in RELEASE_FIELDS},
            z_file=str(z_file),
            z_sha256=digest,
            strategy=body.strategy,
            strategy_params=params.model_dump(mode="json"),
            strategy_state=state,
            iterations_total=body.iterations,
            seed=body.seed,
            outputs_private=me.output_privacy is not None,
            status="ready",
            iterations_done=0,
            rounds_done=0,
        )
        log.info(
            "study %s (%s) created on release %s (n=%d, r=%d)", study_id, body.strategy, body.release_id, n, r
        )
        return repo.add_study(session, study)

    def best(self, study: Study) -> BestPoint | None:
        """The best answer so far, labelled noisy when the grant privatises outcomes."""
        if study.best_index is None or study.best_y is None:
            return None
        return BestPoint(index=study.best_index, y=study.best_y, noisy=study.outputs_private)

    def load_inputs(self, data_dir: Path, study: Study) -> Any:
        """Z [n, r] as stored with the study, checked against its sha256: in memory, or on the dask backend
        memory-mapped, so that this process never holds all of Z and the cluster's partitions can load their
        own rows (``shared.bo.backend.npy_file``; docs/scaling.md)."""
        if study.z_file is None or study.z_sha256 is None:
            raise StorageError(f"study {study.id} runs on a release but has no stored Z")
        path = data_dir / study.z_file
        try:
            digest = npy_sha256(path)
            if digest != study.z_sha256:
                raise StorageError(
                    f"the stored Z of study {study.id} has sha256 {digest}, expected {study.z_sha256}"
                )
            return np.load(path, allow_pickle=False, mmap_mode="r" if uses_dask() else None)
        except OSError as exc:
            raise StorageError(f"the stored Z of study {study.id} cannot be read: {exc.strerror}") from exc

    def target_id(self, study: Study) -> int | None:
        return study.release_id

    def budget_left(self, client: CuratorClient, study: Study) -> tuple[int, str]:
        """The partner token's quota left (the token must read the study's release)."""
        if study.release_id is not None:
            client.get_release(study.release_id)
        return _quota_left(client.get_partner())

    def public_fields(self, study: Study) -> dict[str, Any]:
        if study.release_id is None:
            return {"release": None}
        release = ReleaseInfo(
            id=study.release_id,
            n=study.n,
            r=study.r,
            sha256=study.z_sha256 or "",
            **{key: getattr(study, f"release_{key}") for key in RELEASE_FIELDS},
        )
        return {"release": release}

    # ------------------------------------------------------------------------------------- a request

    def plan(
        self, study: StudyFacts, request: Any, position: int, details: dict[str, Any], key: str
    ) -> PlannedRequest:
        if not isinstance(request, RowRequest) or not 0 <= int(request.index) < study.n:
            raise StrategyError(f"strategy {study.strategy!r} planned an invalid request {request!r}")
        return PlannedRequest(position, self.name, int(request.index), details, key)

    def send(self, client: CuratorClient, study: Study, request: PlannedRequest, what: str) -> QueryPublic:
        if study.release_id is None or request.index is None:  # a row request always names its row
            raise UpstreamError(f"{what}: a row request needs the study's release and a row index")
        if request.query_id is not None:
            query = client.get_query(request.query_id)
        else:
            query = client.create_query(study.release_id, request.index, idempotency_key=request.key)
        if query.index != request.index or query.release_id != study.release_id:
            raise UpstreamError(
                f"{what}: the curator answered query {query.id} for release {query.release_id} row "
                f"{query.index}, but row {request.index} of release {study.release_id} was asked (a reused "
                "Idempotency-Key?)"
            )
        return query

    def refused_for_good(self, error: CuratorError) -> bool:
        """The curator refused the row: its person's output allotment under the grant is used up (409
        ``row-unaffordable``, nothing charged)."""
        return error.code == ROW_UNAFFORDABLE

    def exclusions(
        self, client: CuratorClient, study: Study, refused: PlannedRequest
    ) -> npt.NDArray[np.bool_] | None:
        """The rows the grant can no longer be answered about (``GET /v1/releases/{id}/exclusions``), and
        the refused row whatever the list says (another study on the same token may have moved it since)."""
        if study.release_id is None:
            return None
        mask = self._listed(client, study.release_id, study.n)
        if refused.index is not None and 0 <= refused.index < study.n:
            mask[refused.index] = True
        return mask

    @staticmethod
    def _listed(client: CuratorClient, release_id: int, n: int) -> npt.NDArray[np.bool_]:
        found = client.row_exclusions(release_id)
        if found.only_allowed is not None:
            mask = np.ones(n, dtype=bool)
            allowed = np.asarray(found.only_allowed, dtype=np.int64)
            mask[allowed[(allowed >= 0) & (allowed < n)]] = False
            return mask
        mask = np.zeros(n, dtype=bool)
        excluded = np.asarray(found.excluded, dtype=np.int64)
        mask[excluded[(excluded >= 0) & (excluded < n)]] = True
        return mask

    def is_complete(self, answer: QueryPublic) -> bool:
        return answer.status == "complete"

    def wait(self, client: CuratorClient, answer: QueryPublic, seconds: float) -> QueryPublic:
        return client.get_query(answer.id, wait=seconds)

    def query_id(self, answer: QueryPublic) -> int | None:
        return answer.id

    def answer(self, request: PlannedRequest, answer: QueryPublic) -> Answer:
        if answer.y is None or answer.status != "complete" or request.index is None:
            raise UpstreamError(f"query {answer.id} has no outcome yet")
        return Answer(RowRequest(request.index, request.details), float(answer.y))

    def record(self, request: PlannedRequest, answer: QueryPublic, extra: Mapping[str, Any]) -> Recorded:
        y = self.answer(request, answer).y
        details = {**request.details, **extra} if extra else request.details
        return Recorded(request.index, y, int(answer.id), details)

    def from_record(self, index: int | None, y: float | None, details: Mapping[str, Any]) -> Answer:
        if index is None or y is None:
            raise StorageError("a row audit entry without its row or outcome")
        return Answer(RowRequest(int(index), details), float(y))

    def public(self, request: PlannedRequest, answer: QueryPublic | None) -> RoundQuery:
        answered = answer is not None and answer.status == "complete"
        status = "not_sent" if answer is None and request.query_id is None else "pending"
        return RoundQuery(
            request=request.request,
            kind=self.name,
            index=request.index,
            status="complete" if answered else status,  # type: ignore[arg-type]
            y=answer.y if answered and answer is not None else None,
            curator_query_id=answer.id if answer is not None else request.query_id,
            details=request.details,
        )
