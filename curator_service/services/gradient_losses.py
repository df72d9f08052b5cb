"""The losses of private gradient oracles (DP-GIBO, "Scalable DP Bayesian optimisation", Algorithm 1 line 6:
the per-row losses whose gradients are clipped and averaged): the built-in ones and the operator's plug-ins
(``POBO_CURATOR_GRADIENT_LOSSES``), their checks at creation (``check_loss``: a plug-in must pass the
row-independence check on the dataset's rows), and the loss of an existing oracle over its dataset, local
(``loss_matrix_of``) or for the Dask cluster (``loss_factory_of``). ``curator_service.services.gradients``
creates and steps the oracles."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from curator_service.exceptions import Conflict, InvalidInput
from curator_service.models import Dataset, GradientOracle
from curator_service.services.releases import large_delta
from curator_service.storage import ArrayStore
from shared.bo.gibo.losses import check_row_independent
from shared.bo.gibo.oracle import (
    BUILTIN_LOSSES,
    NEEDS_OUTCOME,
    LossMatrix,
    builtin_loss_matrix,
    loss_dimension,
    plugin_loss_matrix,
)
from shared.errors import InputDataError
from shared.privacy.rng import os_entropy_rng
from shared.protocol.schemas import GradientOracleCreate

__all__ = ["PLUGIN_CHECK_ROWS", "check_loss", "loss_factory_of", "loss_matrix_of", "resolve_plugin"]

PluginFn = Callable[[npt.NDArray[np.float64], npt.NDArray[np.float64]], npt.ArrayLike]
#: Rows the plug-in check perturbs and compares (a subset of the dataset, chosen from OS entropy).
PLUGIN_CHECK_ROWS = 64


# ------------------------------------------------------------------------------------------- the losses


def resolve_plugin(name: str, plugins: Mapping[str, str]) -> PluginFn:
    target = plugins[name]
    module_name, _, attr = target.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise InvalidInput(
            f"plug-in loss {name!r} points at {target!r}, which cannot be imported ({type(exc).__name__}); "
            "fix POBO_CURATOR_GRADIENT_LOSSES"
        ) from None
    if not callable(fn):
        raise InvalidInput(f"plug-in loss {name!r}: {target!r} is not a function")
    return fn  # type: ignore[no-any-return]


def _oracle_plugin(oracle: GradientOracle, plugins: Mapping[str, str]) -> PluginFn:
    """The plug-in loss an existing oracle was created with (409 when the operator has removed it)."""
    if oracle.loss not in plugins:
        raise Conflict(
            f"gradient oracle {oracle.id} uses the plug-in loss {oracle.loss!r}, which is no longer in "
            "POBO_CURATOR_GRADIENT_LOSSES; the operator must restore it"
        )
    return resolve_plugin(oracle.loss, plugins)


def _arrays(store: ArrayStore, dataset: Dataset) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any] | None]:
    X = store.load(dataset.features_path, dataset.features_sha256)
    y = None
    if dataset.outcomes_path is not None and dataset.outcomes_sha256 is not None:
        y = store.load(dataset.outcomes_path, dataset.outcomes_sha256)
    return X, y


def _plugin_rows(X: np.ndarray[Any, Any], y: np.ndarray[Any, Any] | None) -> npt.NDArray[np.float64]:
    rows = np.asarray(X, dtype=np.float64)
    return rows if y is None else np.hstack([rows, np.asarray(y, dtype=np.float64)[:, None]])


def loss_matrix_of(
    oracle: GradientOracle, store: ArrayStore, dataset: Dataset, plugins: Mapping[str, str]
) -> tuple[LossMatrix, int]:
    """The oracle's ``loss_matrix(points, rows)`` over the dataset, and the width of one row."""
    X, y = _arrays(store, dataset)
    params = oracle.loss_params
    if oracle.loss in BUILTIN_LOSSES:
        matrix = builtin_loss_matrix(
            oracle.loss,
            X,
            y if oracle.loss in NEEDS_OUTCOME else None,
            intercept=bool(params.get("intercept")),
            delta_huber=float(params.get("delta_huber") or 1.0),
            weight_clip=float(params.get("weight_clip") or 2.0),
        )
        return matrix, oracle.dimension
    fn = _oracle_plugin(oracle, plugins)
    rows = _plugin_rows(X, y)
    return plugin_loss_matrix(fn, rows), rows.shape[1]


def loss_factory_of(
    oracle: GradientOracle, store: ArrayStore, dataset: Dataset, plugins: Mapping[str, str]
) -> tuple[Any, np.ndarray[Any, Any], np.ndarray[Any, Any] | None, int]:
    """``loss_matrix_of`` for the Dask oracle: (the loss as a factory over a block of rows, the features, the
    outcomes the loss reads or None, the width of one row): the same loss on the same rows."""
    from shared.distributed.gradients import builtin_loss_factory, plugin_loss_factory

    X, y = _arrays(store, dataset)
    params = oracle.loss_params
    if oracle.loss in BUILTIN_LOSSES:
        factory = builtin_loss_factory(
            oracle.loss,
            intercept=bool(params.get("intercept")),
            delta_huber=float(params.get("delta_huber") or 1.0),
            weight_clip=float(params.get("weight_clip") or 2.0),
        )
        return factory, X, y if oracle.loss in NEEDS_OUTCOME else None, oracle.dimension
    fn = _oracle_plugin(oracle, plugins)
    width = int(X.shape[1]) + (0 if y is None else 1)  # as _plugin_rows: the outcome column last
    return plugin_loss_factory(fn), X, y, width


def check_loss(
    store: ArrayStore, dataset: Dataset, body: GradientOracleCreate, plugins: Mapping[str, str]
) -> None:
    """Refuse (422) what would break the guarantee or make no sense, before anything is written."""
    if dataset.scaling.get("kind") == "max_norm":
        raise InvalidInput(
            f"dataset {dataset.id} was scaled with max_norm, whose factor is computed from every row: one "
            "person's row then moves every other row, and the per-row sensitivity a gradient oracle's "
            "guarantee rests on does not hold. Upload the data with scaling none or declared per-feature "
            "scales."
        )
    if large_delta(body.delta, dataset.n):
        raise InvalidInput(
            f"delta = {body.delta:g} is not below 1/n = {1.0 / dataset.n:.3g} (dataset {dataset.id} has "
            f"n = {dataset.n} rows): such a delta protects nobody in particular. Choose delta < 1/n."
        )
    if body.loss in BUILTIN_LOSSES:
        try:
            expected = loss_dimension(body.loss, dataset.d, intercept=body.intercept)
        except InputDataError as exc:
            raise InvalidInput(str(exc)) from None
        if body.dimension != expected:
            extra = " + 1 (intercept)" if body.intercept else ""
            raise InvalidInput(
                f"{body.loss} over dataset {dataset.id}'s {dataset.d} feature columns has dimension "
                f"{dataset.d}{extra} = {expected}, not {body.dimension}"
            )
        if body.loss in NEEDS_OUTCOME:
            X, y = _arrays(store, dataset)
            if dataset.objective_mode != "column" or y is None:
                raise InvalidInput(
                    f"{body.loss} reads the outcome column, and dataset {dataset.id} has none (its outcomes "
                    "are measured by hand): use gaussian-location or a dataset with an objective column"
                )
            if body.loss == "logistic-regression" and not np.isin(np.asarray(y), (0.0, 1.0)).all():
                raise InvalidInput(
                    f"logistic-regression needs 0/1 labels in the objective column "
                    f"{dataset.objective!r} of dataset {dataset.id}; it holds other values"
                )
        return
    if body.loss not in plugins:
        known = ", ".join([*BUILTIN_LOSSES, *sorted(plugins)])
        raise InvalidInput(f"unknown loss {body.loss!r}; this curator offers: {known}")
    if body.intercept:
        raise InvalidInput("intercept applies to the built-in regression losses only")
    fn = resolve_plugin(body.loss, plugins)
    X, y = _arrays(store, dataset)
    rng = os_entropy_rng()
    take = np.sort(rng.choice(dataset.n, size=min(dataset.n, PLUGIN_CHECK_ROWS), replace=False))
    rows = _plugin_rows(np.asarray(X[take]), None if y is None else np.asarray(y[take]))
    bounds = np.asarray(body.bounds, dtype=np.float64)
    theta = bounds[:, 0] + (bounds[:, 1] - bounds[:, 0]) * rng.random((3, body.dimension))

    def transposed(theta_batch: Any, table: Any, *, f: PluginFn = fn) -> Any:
        return np.asarray(f(theta_batch, table)).T

    try:
        check_row_independent(partial(transposed), rows, rng=rng, theta_batch=theta)
    except InputDataError as exc:
        raise InvalidInput(f"plug-in loss {body.loss!r} was refused: {exc}") from None
