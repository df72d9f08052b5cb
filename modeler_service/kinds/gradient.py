"""The ``gradient`` request kind: one private gradient step of a curator gradient oracle (DP-GIBO,
"Scalable Differentially Private Bayesian Optimization", Algorithm 1 lines 5-8; ``POST
/v1/gradient-oracles/{id}/steps`` with the body written ahead in the intent, answered at once by a
``GradientStepResult``). Recorded with index and y null, the step number as curator query id and the step's
inputs, the noisy gradient and the strategy's outcome (theta_next) in ``details``. A study of a gradient
strategy runs on the oracle's public parameters, kept with the study; its best point is its theta."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from sqlalchemy.orm import Session

from modeler_service import repository as repo
from modeler_service.exceptions import StorageError, Unprocessable, UpstreamError
from modeler_service.kinds.base import PlannedRequest, Recorded, RequestKind, Services, StudyFacts
from modeler_service.models import Study
from modeler_service.schemas import BestPoint, RoundQuery, StudyCreate
from modeler_service.upstream import upstream
from shared.bo.strategies import (
    GradientAnswer,
    GradientDomain,
    GradientRequest,
    Strategy,
    StrategyParams,
    gradient_answer_from_record,
    gradient_record,
)
from shared.errors import InputDataError, StrategyError
from shared.privacy.rng import os_entropy_rng
from shared.protocol.client import CuratorClient, CuratorError
from shared.protocol.schemas import GradientStepResult
from shared.protocol.schemas.gradients import MAX_DESIGN_POINTS, GradientOracleInfo
from shared.servicekit.console.charts import Series, line_chart

if TYPE_CHECKING:
    from matplotlib.axes import Axes

log = logging.getLogger("pobo.modeler")

#: Coordinates of theta drawn in a gradient study's plot and chart (the first ones; the title says how
#: many in all).
PLOT_COORDINATES = 10


class GradientKind(RequestKind):
    name = "gradient"
    runs_on = "gradient-oracle"

    # ------------------------------------------------------------------------------------- the study

    def create(
        self,
        session: Session,
        services: Services,
        body: StudyCreate,
        strategy: type[Strategy[Any, Any]],
        params: StrategyParams,
    ) -> Study:
        """Fetch the gradient oracle's public parameters (404 when unknown or not granted), check that the
        study's iterations fit the steps it has left and that the parameters fit its domain, then the
        study."""
        oracle_id = body.gradient_oracle_id
        if oracle_id is None:  # StudyCreate checks it; for the type checker
            raise Unprocessable(
                f"strategy {body.strategy!r} runs on a curator gradient oracle: give gradient_oracle_id"
            )
        token = body.curator_token.get_secret_value()
        what = f"gradient oracle {oracle_id}"
        client = services.client_factory(body.curator_url, token)
        try:
            oracle = client.get_gradient_oracle(oracle_id)
        except CuratorError as exc:
            raise upstream(exc, what) from exc
        finally:
            client.close()
        if body.iterations > oracle.steps_left:
            raise Unprocessable(
                f"iterations must be <= the {oracle.steps_left} steps {what} has left (of {oracle.steps}), "
                f"got {body.iterations}: ask for at most {oracle.steps_left} iterations, or ask the curator "
                "for an oracle with more steps"
            )
        public = GradientOracleInfo.of(oracle).model_dump(mode="json")
        domain = GradientDomain.from_public(public, max_design=MAX_DESIGN_POINTS)
        rng = np.random.default_rng(body.seed) if body.seed is not None else os_entropy_rng()
        try:
            strategy.check_domain(params, domain, budget=body.iterations)
            state = strategy.initial_state(params, n=oracle.n, budget=body.iterations, rng=rng)
            start = strategy(domain, params, state).point()
        except InputDataError as exc:
            raise Unprocessable(f"{exc} ({what}: dimension {domain.dimension})") from exc
        study = Study(
            id=uuid.uuid4().hex,
            curator_url=body.curator_url.rstrip("/"),
            curator_token_enc=services.encrypt(token),
            release_id=None,
            n=oracle.n,
            r=oracle.dimension,
            gradient_oracle_id=oracle_id,
            gradient_oracle=public,
            theta=None if start is None else [float(v) for v in start],
            strategy=body.strategy,
            strategy_params=params.model_dump(mode="json"),
            strategy_state=state,
            iterations_total=body.iterations,
            seed=body.seed,
            status="ready",
            iterations_done=0,
            rounds_done=0,
        )
        log.info(
            "study %s (%s) created on gradient oracle %s (d=%d, steps left %d)",
            study.id,
            body.strategy,
            oracle_id,
            oracle.dimension,
            oracle.steps_left,
        )
        return repo.add_study(session, study)

    def load_inputs(self, data_dir: Path, study: Study) -> GradientDomain:
        """The oracle's domain, from the public parameters stored with the study."""
        if not study.gradient_oracle:
            raise StorageError(f"study {study.id} runs on a gradient oracle but has no oracle parameters")
        return GradientDomain.from_public(study.gradient_oracle)

    def target_id(self, study: Study) -> int | None:
        return study.gradient_oracle_id

    def budget_left(self, client: CuratorClient, study: Study) -> tuple[int, str]:
        """The steps the study's gradient oracle has left (the token must read the oracle)."""
        if study.gradient_oracle_id is None:
            raise StorageError(f"study {study.id} runs on a gradient oracle but names none")
        oracle = client.get_gradient_oracle(study.gradient_oracle_id)
        left = oracle.steps_left
        return left, f"{left} steps gradient oracle {study.gradient_oracle_id} has left (of {oracle.steps})"

    def best(self, study: Study) -> BestPoint | None:
        """The study's current theta."""
        if study.theta is None:
            return None
        return BestPoint(index=None, y=None, theta=[float(v) for v in study.theta])

    def public_fields(self, study: Study) -> dict[str, Any]:
        return {
            "release": None,
            "gradient_oracle_id": study.gradient_oracle_id,
            "gradient_oracle": study.gradient_oracle,
        }

    def chart(self, session: Session, study: Study) -> bytes:
        """The path of theta, one line per coordinate (the first ones), as ``plot`` draws it."""
        path = theta_path(session, study.id)
        series = []
        if path:
            steps = [float(k) for k in range(len(path))]
            for k in range(min(len(path[0]), PLOT_COORDINATES)):
                series.append(Series(f"theta[{k}]", steps, [p[k] for p in path], markers=True))
        return line_chart(series, title="Path of theta", xlabel="step", ylabel="theta", empty="no steps yet")

    def plot(self, ax: Axes, session: Session, study: Study) -> bool:
        thetas = np.asarray(theta_path(session, study.id), dtype=np.float64)
        if thetas.size:
            d = thetas.shape[1]
            steps = np.arange(thetas.shape[0])
            for k in range(min(d, PLOT_COORDINATES)):
                ax.plot(steps, thetas[:, k], marker="o", ms=3, lw=1.5, label=f"theta[{k}]")
            ax.legend(loc="best", fontsize="small")
            shown = f"d={d}" if d <= PLOT_COORDINATES else f"first {PLOT_COORDINATES} of d={d}"
        else:
            ax.text(0.5, 0.5, "no steps yet", ha="center", va="center", transform=ax.transAxes)
            shown = "no steps"
        ax.set_xlabel("step")
        ax.set_ylabel("theta")
        ax.set_title(
            f"study {study.id[:8]}: {study.strategy} on gradient oracle {study.gradient_oracle_id} ({shown})"
        )
        ax.grid(alpha=0.3)
        return True

    # ------------------------------------------------------------------------------------- a request

    def plan(
        self, study: StudyFacts, request: Any, position: int, details: dict[str, Any], key: str
    ) -> PlannedRequest:
        if not isinstance(request, GradientRequest) or study.target_id is None:
            raise StrategyError(f"strategy {study.strategy!r} planned an invalid request {request!r}")
        body = request.body()
        json.dumps(body, allow_nan=False)  # fails here rather than at the curator
        return PlannedRequest(position, self.name, None, details, key, body=body)

    def send(
        self, client: CuratorClient, study: Study, request: PlannedRequest, what: str
    ) -> GradientStepResult:
        if study.gradient_oracle_id is None or request.body is None:
            raise UpstreamError(f"{what}: a gradient request needs the study's gradient oracle and a body")
        result = client.gradient_step(study.gradient_oracle_id, request.body, idempotency_key=request.key)
        dimension = len(request.body["theta"])
        if len(result.gradient) != dimension:
            raise UpstreamError(
                f"{what}: gradient oracle {study.gradient_oracle_id} answered step {result.step} with "
                f"{len(result.gradient)} numbers, but theta has {dimension}"
            )
        return result

    def answer(self, request: PlannedRequest, answer: GradientStepResult) -> GradientAnswer:
        body = request.body or {}
        planned = GradientRequest(
            theta=tuple(float(v) for v in body["theta"]),
            points=tuple(tuple(float(v) for v in p) for p in body["points"]),
            kernel=dict(body["kernel"]),
            noise_var=float(body["noise_var"]),
            jitter=float(body["jitter"]),
            details=request.details,
        )
        return GradientAnswer(planned, tuple(float(v) for v in answer.gradient), int(answer.step))

    def record(
        self, request: PlannedRequest, answer: GradientStepResult, extra: Mapping[str, Any]
    ) -> Recorded:
        details = gradient_record(self.answer(request, answer), extra)
        return Recorded(None, None, int(answer.step), details)

    def from_record(self, index: int | None, y: float | None, details: Mapping[str, Any]) -> GradientAnswer:
        return gradient_answer_from_record(details)

    def public(self, request: PlannedRequest, answer: GradientStepResult | None) -> RoundQuery:
        if answer is None:
            return RoundQuery(
                request=request.request,
                kind=self.name,
                index=None,
                status="not_sent",
                y=None,
                curator_query_id=request.query_id,
                details=request.details,
            )
        return RoundQuery(
            request=request.request,
            kind=self.name,
            index=None,
            status="complete",
            y=None,
            curator_query_id=answer.step,
            details={**request.details, "gradient": list(answer.gradient), "steps_left": answer.steps_left},
        )


def theta_path(session: Session, study_id: str) -> list[list[float]]:
    """theta^(0), theta^(1), ... of a gradient-oracle study, from its audit entries' ``theta`` and
    ``theta_next`` (empty before the first step)."""
    path: list[list[float]] = []
    for e in repo.audit_entries(session, study_id):
        details = e.details or {}
        if e.kind != GradientKind.name or "theta" not in details or "theta_next" not in details:
            continue
        if not path:
            path.append([float(v) for v in details["theta"]])
        path.append([float(v) for v in details["theta_next"]])
    return path
