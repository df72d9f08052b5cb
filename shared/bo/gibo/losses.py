"""Per-user loss matrices for DP-GIBO, and the registration check of a plug-in loss.

Notation::

    theta_batch  [b, d]  b candidate parameters (design points of the surrogate)
    X            [n, d]  one row per user: x_i
    y            [n]     one response per user: y_i
    L            [b, n]  L[k, i] = loss of user i at theta_k,  L(theta_k, x_i) in the paper

DP-GIBO ("Scalable Differentially Private Bayesian Optimization", Algorithm 1, line 6) fits one surrogate
gradient per user from the column L[:, i] and clips it to norm B; the replace-one sensitivity 2B / n of the
clipped mean (proof of Lemma 3.1) holds only if **column i depends on user i's row alone**. A loss that
normalises across users (by a column max, a mean, a rank) lets one user's row move every other user's
gradient, and the privacy guarantee is void. ``check_row_independent`` is the test a plug-in loss must pass
before it is registered.

Built-in losses (each one vectorised expression, no loop over users):

* ``gaussian_location`` -- Section 4.1: x_i ~ N(theta, I_d), negative log-likelihood
  ``0.5 ||x_i - theta||^2 + (d / 2) log(2 pi)``; the paper drops the constant ("up to a constant"), and so
  does this function unless ``constant=True`` (it moves no gradient).
* ``huber_regression`` -- Section 4.2: ``rho_c(y_i - x_i^T theta) * min(1, 2 / ||x_i||^2)`` with the Huber
  loss rho_c, c = 1. What the paper clips is the **loss**, by a per-user weight that depends on ||x_i||
  only; the residual is not clipped (the Huber loss itself bounds its derivative by c). The gradient is
  ``-psi_c(r) x_i min(1, clip / ||x_i||^2)`` with |psi_c| <= c, so its norm is at most
  ``c min(||x_i||, clip / ||x_i||) <= c sqrt(clip)`` (sqrt(2) for the paper's c = 1, clip = 2): the
  "bounded global sensitivity" the paper states. Here c is ``delta_huber`` and the 2 is ``clip``.
* ``logistic_regression`` -- y_i in {0, 1}, negative log-likelihood of P(y = 1) = sigmoid(x_i^T theta):
  ``log(1 + e^z) - y z`` with z = x_i^T theta, as ``np.logaddexp(0, z) - y z`` (no overflow).

Huber loss (Huber 1964): rho_c(r) = r^2 / 2 for |r| <= c, c |r| - c^2 / 2 otherwise; computed as
``0.5 m^2 + c (|r| - m)`` with m = min(|r|, c), which never squares a large residual.

Contract of every loss here: theta_batch and the shapes are validated (``InputDataError``); the data values
are not -- a row with nan or inf gives a non-finite entry in its own column, which the caller zeroes (the
arithmetic ignores overflow, invalid values and division by zero, so no warning or FloatingPointError).

No subnormal numbers (timing). An operation that makes or takes a subnormal float runs ~100x slower on
common CPUs, so a loss that underflowed on some rows only would tell a partner, through the time of a step,
that a row holds a value near what its theta probes. So no operation here underflows, whatever the rows and
theta: entries of the rows and of theta below 2^-400 in magnitude count as 0 (``flush_tiny``), a difference
or residual below 2^-500 is flushed before it is squared, and the logistic loss's softplus takes its
argument clamped to [-700, 700] (exactly z beyond 700, and within e^-700 ~ 1e-304 of the exact loss below
-700). ``tests/shared/test_gibo_losses.py`` runs every loss on adversarial rows under
``np.errstate(under="raise")``. Plug-in losses run the curator's own code: their time is theirs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from shared.errors import InputDataError

__all__ = [
    "TINY",
    "TINY_DIFFERENCE",
    "LossFn",
    "flush_tiny",
    "check_row_independent",
    "gaussian_location",
    "huber_regression",
    "logistic_regression",
]

Array = npt.NDArray[np.float64]
LossFn = Callable[..., Any]

#: Inputs (rows, theta) below this magnitude count as 0: their products stay >= 2^-800, normal floats.
TINY = 2.0**-400
#: A difference or residual below this is flushed before it is squared (its square stays normal).
TINY_DIFFERENCE = 2.0**-500
#: The softplus argument's clamp: exp(-700) ~ 1e-304 is a normal float, exp(-745) is not even subnormal.
SOFTPLUS_CLAMP = 700.0


def _quiet() -> np.errstate:
    """Ignore overflow, invalid values and division by zero, never underflow (the caller may raise on it,
    as the tests do)."""
    return np.errstate(over="ignore", invalid="ignore", divide="ignore")


def flush_tiny(values: npt.ArrayLike, floor: float = TINY) -> Array:
    """``values`` with every entry of magnitude below ``floor`` set to 0 (NaN and inf kept): a comparison
    and a select, which take the same time for every float."""
    a = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        out: Array = np.where(np.abs(a) < floor, 0.0, a)
    return out


def _as_float(name: str, value: npt.ArrayLike, ndim: int) -> Array:
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputDataError(f"{name} must be a numeric array") from None
    if array.ndim != ndim:
        raise InputDataError(f"{name} must be a {ndim}-D array, got shape {array.shape}")
    return array


def _theta(theta_batch: npt.ArrayLike, d: int) -> Array:
    theta = _as_float("theta_batch", theta_batch, 2)
    if theta.shape[1] != d:
        raise InputDataError(f"theta_batch must have shape [b, {d}] (d = columns of X), got {theta.shape}")
    if not np.isfinite(theta).all():
        raise InputDataError("theta_batch must be finite")
    return theta


def _rows(X: npt.ArrayLike, y: npt.ArrayLike | None = None) -> tuple[Array, Array | None]:
    features = _as_float("X", X, 2)
    if y is None:
        return features, None
    response = _as_float("y", y, 1)
    if response.shape[0] != features.shape[0]:
        raise InputDataError(
            f"y must have one entry per row of X: X has {features.shape[0]} rows, y has {response.shape[0]}"
        )
    return features, response


def _positive(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value <= 0:
        raise InputDataError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def gaussian_location(theta_batch: npt.ArrayLike, X: npt.ArrayLike, *, constant: bool = False) -> Array:
    """[b, n]: 0.5 ||x_i - theta_k||^2 (+ (d/2) log(2 pi) if ``constant``) -- DP-GIBO Section 4.1.

    Computed from the differences (not the expansion ||x||^2 - 2 x.theta + ||theta||^2, which cancels);
    memory O(b n d).
    """
    features, _ = _rows(X)
    theta = flush_tiny(_theta(theta_batch, features.shape[1]))
    with _quiet():  # data values may be anything: non-finite entries are the caller's
        diff = flush_tiny(flush_tiny(features)[None, :, :] - theta[:, None, :], TINY_DIFFERENCE)
        loss: Array = 0.5 * np.einsum("bnd,bnd->bn", diff, diff)
        if constant:
            loss = loss + 0.5 * features.shape[1] * math.log(2.0 * math.pi)
    return loss


def huber_regression(
    theta_batch: npt.ArrayLike,
    X: npt.ArrayLike,
    y: npt.ArrayLike,
    *,
    delta_huber: float = 1.0,
    clip: float = 2.0,
) -> Array:
    """[b, n]: rho_c(y_i - x_i^T theta_k) * min(1, clip / ||x_i||^2) -- DP-GIBO Section 4.2, eq. for f_x.

    ``delta_huber`` is the Huber tuning parameter c (paper: 1), ``clip`` the numerator of the per-user loss
    weight (paper: 2). The weight is written ``clip / max(||x_i||^2, clip)``, equal to min(1, clip/||x_i||^2)
    and free of a division by zero at x_i = 0.
    """
    c = _positive("delta_huber", delta_huber)
    clip = _positive("clip", clip)
    features, response = _rows(X, y)
    assert response is not None
    theta = flush_tiny(_theta(theta_batch, features.shape[1]))
    features, response = flush_tiny(features), flush_tiny(response)
    with _quiet():
        abs_residual = np.abs(flush_tiny(response[None, :] - theta @ features.T, TINY_DIFFERENCE))
        m = np.minimum(abs_residual, c)
        weight: Array = clip / np.maximum(np.einsum("nd,nd->n", features, features), clip)
        loss: Array = (0.5 * m * m + c * (abs_residual - m)) * weight[None, :]
    return loss


def logistic_regression(theta_batch: npt.ArrayLike, X: npt.ArrayLike, y: npt.ArrayLike) -> Array:
    """[b, n]: log(1 + exp(z)) - y_i z with z = x_i^T theta_k, y_i in {0, 1} (Bernoulli-logit NLL).

    ``np.logaddexp(0, z)`` never forms exp(z), so |z| up to ~1e308 gives a finite loss; it takes z clamped to
    [-700, 700] (plus z - 700 above), so that it never underflows (module docstring).
    """
    features, response = _rows(X, y)
    assert response is not None
    theta = flush_tiny(_theta(theta_batch, features.shape[1]))
    features, response = flush_tiny(features), flush_tiny(response)
    with _quiet():
        z = theta @ features.T
        clamped = np.clip(z, -SOFTPLUS_CLAMP, SOFTPLUS_CLAMP)
        softplus = np.logaddexp(0.0, clamped) + np.maximum(z - SOFTPLUS_CLAMP, 0.0)
        loss: Array = softplus - response[None, :] * z
    return loss


def _bits(array: Array) -> npt.NDArray[np.uint64]:
    return np.ascontiguousarray(array, dtype=np.float64).view(np.uint64)


def _same(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> bool:
    """Bitwise equality of two arrays of one shape and dtype (nan == nan, 0.0 != -0.0)."""
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def check_row_independent(
    loss: LossFn,
    *rows: npt.ArrayLike,
    rng: np.random.Generator,
    theta_batch: npt.ArrayLike | None = None,
) -> None:
    """Refuse a plug-in loss whose column i is not a function of row i alone (``InputDataError``).

    ``loss(theta_batch, *rows)`` must return [b, n], n the common first dimension of ``rows`` (pass
    keyword parameters with ``functools.partial``). The check evaluates the loss, replaces ONE user (an index
    drawn from ``rng``) by a far-away row -- in every array of ``rows`` -- re-evaluates, and requires every
    other user's column to be bitwise unchanged; it also refuses a loss that writes into its inputs.
    ``theta_batch`` defaults to 3 standard normal points in R^d (d = columns of the first row array, 1 if it
    is 1-D). A passing check is necessary, not sufficient: it probes one user with one perturbation.
    """
    name = getattr(loss, "__name__", None) or type(loss).__name__
    if not rows:
        raise InputDataError("check_row_independent needs at least one row array (e.g. X)")
    arrays = [np.array(r) for r in rows]
    for k, a in enumerate(arrays):
        if a.dtype.kind not in "biuf":
            raise InputDataError(f"row array {k} must be numeric (bool, int or float), got dtype {a.dtype}")
        if a.ndim == 0:
            raise InputDataError(f"row array {k} must have one entry per user along axis 0, got a scalar")
    n = arrays[0].shape[0]
    if any(a.shape[0] != n for a in arrays):
        raise InputDataError(
            f"every row array must have the same number of users: got {[a.shape[0] for a in arrays]}"
        )
    if n < 2:
        raise InputDataError(f"check_row_independent needs at least 2 users, got {n}")
    d = arrays[0].shape[1] if arrays[0].ndim >= 2 else 1
    theta = rng.standard_normal((3, d)) if theta_batch is None else _as_float("theta_batch", theta_batch, 2)
    b = theta.shape[0]

    def evaluate(data: list[np.ndarray[Any, Any]], label: str) -> Array:
        copies = [a.copy() for a in data]
        try:
            out = np.asarray(loss(theta.copy(), *copies), dtype=np.float64)
        except InputDataError:
            raise
        except Exception as exc:  # a plug-in may raise anything: report it as a refusal
            # the exception's text is not quoted: it may contain a raw data value (chained, for logs)
            raise InputDataError(f"loss {name!r} raised {type(exc).__name__} on the {label} rows") from exc
        if out.shape != (b, n):
            raise InputDataError(
                f"loss {name!r} must return shape (b, n) = ({b}, {n}) for theta_batch [{b}, {d}] and {n} "
                f"users, got {out.shape}"
            )
        if not all(_same(c, a) for c, a in zip(copies, data, strict=True)):
            raise InputDataError(f"loss {name!r} modified its input rows; a loss must not write into them")
        return out

    before = evaluate(arrays, "original")
    j = int(rng.integers(n))
    perturbed = []
    for a in arrays:
        p = a.astype(np.float64) if a.dtype.kind != "f" else a.copy()
        scale = 1.0 + float(np.max(np.abs(p[np.isfinite(p)]), initial=0.0))
        p[j] = p[j] + 10.0 * scale * (1.0 + rng.random(p[j].shape)) * rng.choice([-1.0, 1.0], p[j].shape)
        perturbed.append(p)
    after = evaluate(perturbed, "perturbed")
    others = np.arange(n) != j
    changed = np.flatnonzero((_bits(before) != _bits(after))[:, others].any(axis=0))
    if changed.size:
        raise InputDataError(
            f"loss {name!r} is not row-independent: changing user {j}'s row changed the loss of "
            f"{changed.size} other user(s). In DP-GIBO user i's loss column must be computed from row i "
            "alone (no normalisation, centring, ranking or any statistic across users, and no randomness), "
            "otherwise one user moves every clipped gradient and the 2B/n sensitivity of Lemma 3.1 fails. "
            "Compute cross-user quantities from public constants instead."
        )
