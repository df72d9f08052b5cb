"""Gradient oracles (DP-GIBO): create (admin; charges the whole mu-GDP), read, step (granted partner)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Response

from curator_service.api.deps import AdminDep, ComponentsDep, PartnerDep, PrincipalDep, RowId, SessionDep
from curator_service.services import gradients as gradient_service
from shared.protocol.schemas import (
    GradientOracleCreate,
    GradientOraclePublic,
    GradientOraclesPublic,
    GradientStepCreate,
    GradientStepRecord,
    GradientStepResult,
    GradientStepsPublic,
)

router = APIRouter(tags=["gradient oracles"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "Missing or invalid token."},
    403: {"description": "Wrong kind of token (admin-only, or partner-only)."},
    404: {"description": "No such dataset or gradient oracle (or not granted to this partner)."},
    410: {
        "description": "Its dataset was erased (`DELETE /v1/datasets/{id}`); the detail says what: "
        "`gradient oracle N was erased: its dataset was erased by the curator`, `dataset N was erased`, ..."
    },
}


@router.post(
    "/v1/datasets/{dataset_id}/gradient-oracles",
    status_code=201,
    response_model=GradientOraclePublic,
    summary="Create a private gradient oracle (admin): charges its whole mu-GDP cost now",
    description="The oracle answers `steps` DP-GIBO steps on this dataset's rows: per-row gradients of the "
    "GP posterior mean of `loss`, clipped to norm `clip`, averaged, plus Gaussian noise of std "
    "2 clip sqrt(steps) / (n mu) (mu-GDP over all steps). mu is converted to epsilon at `delta` and "
    "charged to the population's ledger at once (409, nothing written, when it does not fit). Losses: "
    "`gaussian-location`, `huber-regression` (objective column = response; `delta_huber`, `weight_clip`), "
    "`logistic-regression` (objective column = 0/1 label); `intercept` adds a constant feature. A plug-in "
    "loss named in the operator's settings is checked for row independence first. Refused with 422: "
    "datasets scaled by max_norm (data-dependent), delta >= 1/n, a dimension that does not match the "
    "loss.",
    responses={
        **_ERRORS,
        409: {"description": "The population's privacy budget would be exceeded."},
        422: {"description": "Invalid or refused parameters (the detail says which and why)."},
    },
)
def create_oracle(
    dataset_id: RowId, body: GradientOracleCreate, _admin: AdminDep, components: ComponentsDep
) -> GradientOraclePublic:
    oracle = gradient_service.create_oracle(
        components.db, components.store, dataset_id, body, components.settings.gradient_losses
    )
    return gradient_service.oracle_public(oracle)


@router.get(
    "/v1/gradient-oracles",
    response_model=GradientOraclesPublic,
    summary="Gradient oracles you may read (admin: all; partner: granted)",
    responses={401: _ERRORS[401]},
)
def list_oracles(principal: PrincipalDep, session: SessionDep) -> GradientOraclesPublic:
    oracles = gradient_service.list_oracles(session, principal)
    return GradientOraclesPublic(
        data=[gradient_service.oracle_public(o) for o in oracles], count=len(oracles)
    )


@router.get(
    "/v1/gradient-oracles/{oracle_id}",
    response_model=GradientOraclePublic,
    summary="One gradient oracle: parameters, steps used, mu spent (admin or granted partner)",
    responses=_ERRORS,
)
def get_oracle(oracle_id: RowId, principal: PrincipalDep, session: SessionDep) -> GradientOraclePublic:
    return gradient_service.oracle_public(gradient_service.get_oracle(session, principal, oracle_id))


@router.post(
    "/v1/gradient-oracles/{oracle_id}/steps",
    status_code=201,
    response_model=GradientStepResult,
    summary="One private gradient step (granted partner; Idempotency-Key)",
    description="Send the step's data-independent inputs: `theta`, the new batch `points` (the design is "
    "every point sent so far, in order, plus these), the `kernel` and its hyper-parameters, optionally "
    "`noise_var` (s3.4) and `jitter`. theta and every point must lie inside the oracle's bounds (422 "
    "before any row is read). The answer is the noisy clipped average gradient of the GP posterior mean "
    "at theta, and nothing else. With an `Idempotency-Key`, a retry with the same body returns the stored "
    "answer (`Idempotent-Replayed: true`) and is not a new step; the same key with another body is a 409. "
    "409 once all `steps` are used.",
    responses={
        **_ERRORS,
        409: {"description": "All steps are used, or the Idempotency-Key was used with another body."},
        422: {"description": "Inputs outside the bounds, of the wrong shape, or a kernel that does not fit."},
    },
)
def create_step(
    oracle_id: RowId,
    body: GradientStepCreate,
    partner: PartnerDep,
    components: ComponentsDep,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(max_length=200, description="Any unique string per logical step, e.g. '<study>-<round>'."),
    ] = None,
) -> GradientStepResult:
    record, steps_left, replayed = gradient_service.step(
        components.db,
        components.store,
        partner,
        oracle_id,
        body,
        idempotency_key,
        components.settings.gradient_losses,
        backend=components.compute_backend,
    )
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return GradientStepResult(step=record.step, gradient=list(record.gradient), steps_left=steps_left)


@router.get(
    "/v1/gradient-oracles/{oracle_id}/steps",
    response_model=GradientStepsPublic,
    summary="Answered steps (admin: all; partner: its own)",
    responses=_ERRORS,
)
def list_steps(oracle_id: RowId, principal: PrincipalDep, session: SessionDep) -> GradientStepsPublic:
    steps = gradient_service.list_steps(session, principal, oracle_id)
    data = [
        GradientStepRecord(
            step=s.step,
            partner_id=s.partner_id,
            theta=list(s.theta),
            points=[list(p) for p in s.points],
            kernel=dict(s.kernel),
            noise_var=s.noise_var,
            gradient=list(s.gradient),
            idempotency_key=s.idempotency_key,
            created_at=s.created_at,
        )
        for s in steps
    ]
    return GradientStepsPublic(data=data, count=len(data))
