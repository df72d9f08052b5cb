"""The curator's side of one DP-GIBO step: the private gradient oracle, as one pure function.

Paper: "Scalable DP Bayesian optimisation" (DP-GIBO), Algorithm 1 lines 5-8 and Lemma 3.1. In pobo the
modeler chooses theta_t and the batch Z_t (both data-independent) and the curator, who holds the rows x_i,
answers only the released gradient::

    D_t      = D_{t-1} u Z_t                 the design: every point sent so far, in order      (line 5)
    W        = grad k(theta_t, D_t) (k(D_t, D_t) + (noise_var + jitter) I)^{-1}     [d, m]      (line 6)
    L        = L(D_t, x_i)                   [m, n]: losses of the design on each row
    released = (1/n) sum_i Pi_B(W L[:, i]) + N(0, sigma^2 I_d),  sigma = 2 B sqrt(T) / (n mu)   (lines 7-8)

What keeps Lemma 3.1's guarantee (the sensitivity 2B/n needs column i of L to depend on x_i alone):

* every input that is not data -- theta, the design, the kernel and its hyper-parameters -- is validated
  (``check_step``) *before* a row is read, so an error can never depend on the data;
* the loss is evaluated on the rows in chunks of design points (bounded memory) on a schedule that does not
  depend on the rows (``safe_loss_matrix``): built-in losses are numpy expressions that give a bad row NaN,
  and a plug-in is called one row at a time, so a row that makes it raise gets a NaN column; those columns
  become 0 (``private_gradient``), so what one row does changes only its own column, and the time of a step
  does not depend on how many rows fail;
* the kernel is the one sent with the step: the curator fits nothing on the losses;
* the noise is added exactly (``shared.privacy.lattice``: the clean average snapped to a lattice, integer
  noise) from a fresh OS-keyed AES-CTR generator (``rng`` None).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from shared.bo.gibo.acquisition import as_bounds
from shared.bo.gibo.gp import DEFAULT_JITTER, GradientGP
from shared.bo.gibo.kernels import GradKernel, PolynomialKernel, SEKernel
from shared.bo.gibo.private_gradient import noise_std, private_gradient
from shared.errors import InputDataError

FloatArray = npt.NDArray[np.float64]
#: loss_matrix(points [m, d], rows: index array into the dataset or None for all) -> [m, n_rows]
LossMatrix = Callable[[FloatArray, npt.NDArray[np.intp] | None], npt.ArrayLike]

__all__ = [
    "BUILTIN_LOSSES",
    "MAX_CHUNK_VALUES",
    "NEEDS_OUTCOME",
    "LossMatrix",
    "builtin_loss_matrix",
    "check_step",
    "kernel_from_spec",
    "loss_dimension",
    "oracle_gradient",
    "plugin_loss_matrix",
    "safe_loss_matrix",
]

#: Largest m x n x d intermediate one loss evaluation may build (~64 MB of float64).
MAX_CHUNK_VALUES = 8_000_000


def kernel_from_spec(spec: Mapping[str, Any]) -> GradKernel:
    """The kernel a step names: ``{"kind": "se", "lengthscale", "signal_variance"}`` or
    ``{"kind": "polynomial", "degree", "offset"}``."""
    kind = spec.get("kind")
    if kind == "se":
        return SEKernel(
            lengthscale=float(spec.get("lengthscale", 1.0)),
            signal_variance=float(spec.get("signal_variance", 1.0)),
        )
    if kind == "polynomial":
        return PolynomialKernel(degree=int(spec.get("degree", 2)), offset=float(spec.get("offset", 1.0)))
    raise InputDataError(f'kernel kind must be "se" or "polynomial", got {kind!r}')


def _floats(name: str, value: npt.ArrayLike) -> FloatArray:
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):  # ragged lists, strings: an InputDataError like every other refusal
        raise InputDataError(f"{name} must be a rectangular array of numbers") from None


def check_step(
    theta: npt.ArrayLike, design: npt.ArrayLike, bounds: npt.ArrayLike
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(theta [d], design [m, d], bounds [d, 2]) validated: finite, the right shapes, inside the bounds."""
    bd = _floats("bounds", bounds)
    d = int(bd.shape[0]) if bd.ndim == 2 else 0
    bd = as_bounds(bd, d)
    t = _floats("theta", theta)
    D = _floats("the design", design)
    if t.shape != (d,):
        raise InputDataError(f"theta must have {d} entries (the oracle's dimension), got shape {t.shape}")
    if D.ndim != 2 or D.shape[1] != d or D.shape[0] < 1:
        raise InputDataError(f"the design must be a non-empty list of points with {d} entries each")
    for name, a in (("theta", t[None, :]), ("a point", D)):
        if not np.isfinite(a).all():
            raise InputDataError(f"{name} is not finite")
        outside = (a < bd[:, 0]) | (a > bd[:, 1])
        if outside.any():
            k = int(np.flatnonzero(outside.any(axis=0))[0])
            raise InputDataError(
                f"{name} lies outside the oracle's bounds in coordinate {k} ([{bd[k, 0]:g}, {bd[k, 1]:g}]); "
                "every theta and design point must lie inside the public bounds"
            )
    return t, D, bd


def safe_loss_matrix(loss_matrix: LossMatrix, points: FloatArray, n: int, d_rows: int) -> FloatArray:
    """L [m, n], in chunks of design points over all rows; a row whose loss failed holds NaN there (zeroed
    downstream, before clipping).

    The calls are the same whatever the rows hold: one per chunk of design points (the chunk size depends
    on m, n and the row width only). Built-in losses are numpy expressions that turn a bad row into NaN
    instead of raising; a plug-in is evaluated one row per call on the same fixed schedule whatever fails
    (``plugin_loss_matrix``). So neither which rows fail nor how many changes the work done, or its time:
    a schedule that bisected failing chunks answered "is there a row beyond t?" through response time, to a
    partner who chooses theta. A call that raises all the same, or returns the wrong shape, is a bug of
    the loss, not of a row: it is raised (as an InputDataError for the shape), never retried.
    """
    m = int(points.shape[0])
    per_point = max(1, n * max(1, d_rows))
    chunk = max(1, min(m, MAX_CHUNK_VALUES // per_point))
    L = np.full((m, n), np.nan)
    for start in range(0, m, chunk):
        block = points[start : start + chunk]
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # underflow: see the losses
            out = np.asarray(loss_matrix(block, None), dtype=np.float64)
        if out.shape != (block.shape[0], n):
            raise InputDataError(
                f"the loss returned an array of shape {out.shape} for {block.shape[0]} design points and "
                f"{n} rows; it must return [{block.shape[0]}, {n}]"
            )
        L[start : start + chunk] = out
    return L


def oracle_gradient(
    loss_matrix: LossMatrix,
    *,
    n: int,
    row_width: int,
    theta: npt.ArrayLike,
    design: npt.ArrayLike,
    bounds: npt.ArrayLike,
    kernel: GradKernel,
    clip: float,
    steps: int,
    mu: float,
    rng: np.random.Generator | None = None,
    noise_var: float = 0.0,
    jitter: float = DEFAULT_JITTER,
) -> FloatArray:
    """The released gradient of one step (Alg. 1 lines 5-8); see the module docstring.

    Everything that can fail on its inputs fails before ``loss_matrix`` is called: ``check_step`` and the
    GP's weights depend only on theta, the design and the kernel. ``row_width``: entries per row (for the
    chunk size only). ``rng``: the noise's generator (None: a fresh OS-keyed AES-CTR one, production).
    """
    if not (math.isfinite(noise_var) and noise_var >= 0):
        raise InputDataError(f"noise_var must be a finite number >= 0, got {noise_var!r}")
    noise_std(clip, steps, n, mu)  # validates B, T, n and mu now, not after the rows were read
    t, D, _ = check_step(theta, design, bounds)
    W = GradientGP(kernel, D, noise_var=noise_var, jitter=jitter).grad_weights(t)
    if not np.isfinite(W).all():
        raise InputDataError("the GP's gradient weights are not finite for this design and kernel")
    L = safe_loss_matrix(loss_matrix, D, n, row_width)
    return private_gradient(W, L, B=clip, T=steps, mu=mu, rng=rng)


# ---------------------------------------------------------------------------------------- the losses

#: The built-in losses, by their API names (DP-GIBO s4.1, s4.2, and the Bernoulli-logit NLL).
BUILTIN_LOSSES = ("gaussian-location", "huber-regression", "logistic-regression")
#: Losses that read the dataset's outcome column (as the response / the 0/1 label).
NEEDS_OUTCOME = ("huber-regression", "logistic-regression")


def loss_dimension(loss: str, d: int, *, intercept: bool) -> int:
    """The dimension theta must have for a built-in loss over d feature columns."""
    if loss == "gaussian-location":
        if intercept:
            raise InputDataError("gaussian-location has no intercept: theta is a location in feature space")
        return d
    return d + 1 if intercept else d


def builtin_loss_matrix(
    loss: str,
    X: npt.ArrayLike,
    y: npt.ArrayLike | None = None,
    *,
    intercept: bool = False,
    delta_huber: float = 1.0,
    weight_clip: float = 2.0,
) -> LossMatrix:
    """``loss_matrix(points, rows)`` of a built-in loss over the rows X [n, d] (and outcomes y [n]).

    ``intercept``: theta's first entry multiplies a constant 1 (a public constant: row-independent).
    """
    from shared.bo.gibo import losses

    features = np.asarray(X, dtype=np.float64)
    response = None if y is None else np.asarray(y, dtype=np.float64)
    if loss in NEEDS_OUTCOME and response is None:
        raise InputDataError(f"{loss} needs the dataset's outcome column")

    def rows_of(rows: npt.NDArray[np.intp] | None) -> tuple[FloatArray, FloatArray | None]:
        Xr = features if rows is None else features[rows]
        yr = response if rows is None or response is None else response[rows]
        if intercept:
            Xr = np.hstack([np.ones((Xr.shape[0], 1)), Xr])
        return Xr, yr

    def matrix(points: FloatArray, rows: npt.NDArray[np.intp] | None) -> FloatArray:
        Xr, yr = rows_of(rows)
        if loss == "gaussian-location":
            return losses.gaussian_location(points, Xr)
        if loss == "huber-regression":
            assert yr is not None  # checked above (NEEDS_OUTCOME)
            return losses.huber_regression(points, Xr, yr, delta_huber=delta_huber, clip=weight_clip)
        if loss == "logistic-regression":
            assert yr is not None
            return losses.logistic_regression(points, Xr, yr)
        raise InputDataError(f"unknown built-in loss {loss!r}; built-in: {', '.join(BUILTIN_LOSSES)}")

    return matrix


def plugin_loss_matrix(
    fn: Callable[[FloatArray, FloatArray], npt.ArrayLike], rows: npt.ArrayLike
) -> LossMatrix:
    """``loss_matrix`` of an operator's plug-in ``fn(theta_batch [b, p], rows [m, w]) -> [m, b]``.

    A plug-in is arbitrary code and may raise on some rows. It is therefore called ONE ROW AT A TIME, every
    row once and in order, whatever any call does (a fixed schedule): a row whose call raises, or returns
    anything but a [1, b] array, gets a NaN column (its gradient counts as 0); no call depends on another's
    outcome, so the work of a step, and its time, do not depend on which or how many rows fail. (Isolating
    failing rows by bisecting a failing chunk took 36 calls instead of 1 when one row of 200 000 failed: a
    noiseless answer, through response time, to "is there a row beyond t?".) The price is one call per row:
    about 1.1 s per step at n = 200 000 for a small numpy loss, against 0.08 s for one call on all rows;
    the built-in losses stay vectorised (they turn a bad row into NaN, they never raise).
    """
    table = np.asarray(rows, dtype=np.float64)

    def matrix(points: FloatArray, idx: npt.NDArray[np.intp] | None) -> FloatArray:
        part = table if idx is None else table[idx]
        b = int(points.shape[0])
        out: FloatArray = np.full((b, part.shape[0]), np.nan)
        for i in range(part.shape[0]):  # the fixed schedule: one call per row, whatever the others did
            try:
                with np.errstate(all="ignore"):
                    value = np.asarray(fn(points.copy(), part[i : i + 1].copy()), dtype=np.float64)
            except Exception:  # noqa: BLE001, S112 - a row may make a plug-in raise: its column stays NaN
                continue
            if value.shape == (1, b):
                out[:, i] = value[0]
        return out

    return matrix
