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
* the loss is evaluated on the rows in chunks of design points (bounded memory); a chunk that raises is
  split row-wise until the rows that raise are isolated (``safe_loss_matrix``), and those rows' columns
  become non-finite, then 0 (``private_gradient``), so what one row does changes only its own column;
* the kernel is the one sent with the step: the curator fits nothing on the losses;
* the noise comes from the ``noise`` callable (production: OpenDP's vector Gaussian sampler).
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
from shared.bo.gibo.private_gradient import NoiseFn, noise_std, private_gradient
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


def _evaluate(loss_matrix: LossMatrix, points: FloatArray, rows: npt.NDArray[np.intp] | None, n: int) -> Any:
    """One call; None if it raised or returned the wrong shape (never an error that depends on data)."""
    try:
        with np.errstate(all="ignore"):
            out = np.asarray(loss_matrix(points, rows), dtype=np.float64)
    except Exception:  # noqa: BLE001 - a row may make a plug-in loss raise: that row's column is zeroed
        return None
    return out if out.shape == (points.shape[0], n) else None


def safe_loss_matrix(loss_matrix: LossMatrix, points: FloatArray, n: int, d_rows: int) -> FloatArray:
    """L [m, n], chunked over design points; rows whose evaluation raises get NaN (zeroed downstream).

    A chunk that fails is bisected over the rows (row-independence makes every other row's column the same
    whatever chunk it is evaluated in), so k failing rows cost O(k log n) extra calls.
    """
    m = int(points.shape[0])
    per_point = max(1, n * max(1, d_rows))
    chunk = max(1, min(m, MAX_CHUNK_VALUES // per_point))
    L = np.full((m, n), np.nan)
    for start in range(0, m, chunk):
        block = points[start : start + chunk]
        out = _evaluate(loss_matrix, block, None, n)
        if out is not None:
            L[start : start + chunk] = out
            continue
        stack = [np.arange(n, dtype=np.intp)]
        while stack:
            rows = stack.pop()
            part = _evaluate(loss_matrix, block, rows, rows.size)
            if part is not None:
                L[start : start + chunk, rows] = part
            elif rows.size > 1:
                half = rows.size // 2
                stack.extend([rows[:half], rows[half:]])
            # a single failing row keeps its NaN column: its gradient becomes 0 before clipping
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
    noise: NoiseFn,
    noise_var: float = 0.0,
    jitter: float = DEFAULT_JITTER,
) -> FloatArray:
    """The released gradient of one step (Alg. 1 lines 5-8); see the module docstring.

    Everything that can fail on its inputs fails before ``loss_matrix`` is called: ``check_step`` and the
    GP's weights depend only on theta, the design and the kernel. ``row_width``: entries per row (for the
    chunk size only).
    """
    if not (math.isfinite(noise_var) and noise_var >= 0):
        raise InputDataError(f"noise_var must be a finite number >= 0, got {noise_var!r}")
    noise_std(clip, steps, n, mu)  # validates B, T, n and mu now, not after the rows were read
    t, D, _ = check_step(theta, design, bounds)
    W = GradientGP(kernel, D, noise_var=noise_var, jitter=jitter).grad_weights(t)
    if not np.isfinite(W).all():
        raise InputDataError("the GP's gradient weights are not finite for this design and kernel")
    L = safe_loss_matrix(loss_matrix, D, n, row_width)
    return private_gradient(W, L, B=clip, T=steps, mu=mu, noise=noise)


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
    """``loss_matrix`` of an operator's plug-in ``fn(theta_batch [b, p], rows [m, w]) -> [m, b]``."""
    table = np.asarray(rows, dtype=np.float64)

    def matrix(points: FloatArray, idx: npt.NDArray[np.intp] | None) -> FloatArray:
        part = table if idx is None else table[idx]
        out: FloatArray = np.asarray(fn(points.copy(), part.copy()), dtype=np.float64).T
        return out

    return matrix
