"""Exact GP regression over a fixed, discrete candidate set, updated incrementally.

The modeler's belief in PO-GP-UCB (Kharkovskii et al. 2020, Alg. 2 line 6) is the GP posterior over the n
released rows. Formulas from Rasmussen & Williams, *Gaussian Processes for Machine Learning* (2006), Alg. 2.1
(p. 19) and eq. 2.30 / 5.9 (log marginal likelihood and its gradient).

Notation (shapes in brackets)::

    Z        [n, r]  candidates (fixed); an observation is (i, y): row i of Z and its measured value y
    k(z, z') = s2 exp(-|z - z'|^2 / (2 l^2))      squared exponential; anisotropic l by rescaling Z
    I        [t]     observed row indices;  y [t] outcomes;  m  constant prior mean
    K        [t, t]  k(Z_I, Z_I) + (noise + jitter) Id = L L^T   (Cholesky; grown one row per observation)
    A        [t, n]  L^{-1} k(Z_I, Z)                             (GPML Alg. 2.1 line 5: v = L \\ k_*)
    w        [t]     L^{-1} (y - m)
    mean     [n]     m + A^T w                                    (line 4)
    var      [n]     s2 - sum_rows A^2                            (line 6)

Adding observation (j, y_j) costs O(n (t + r)): one kernel row k(Z_j, Z) [n], one triangular solve
``l = L^{-1} k(Z_I, Z_j)`` [t], and the new row ``a = (k(Z_j, Z) - l^T A) / l_tt`` of A. A refit of the
hyper-parameters rebuilds the factorisation from scratch (O(n t r + n t^2)), on a schedule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy.linalg import cho_factor, cho_solve, solve_triangular

from shared.bo.factor import FactorRows
from shared.bo.parallel import split
from shared.errors import InputDataError

FloatArray = npt.NDArray[np.float64]

__all__ = ["GaussianProcess", "Hyperparameters", "fit_hyperparameters", "median_distance", "se_kernel"]

#: Added to the diagonal of K (beside the noise variance) for numerical stability.
DEFAULT_JITTER = 1e-10


@dataclass(frozen=True)
class Hyperparameters:
    """Squared-exponential kernel hyper-parameters; ``lengthscale`` is a scalar or one per dimension."""

    lengthscale: float | tuple[float, ...]
    signal_variance: float = 1.0
    noise_variance: float = 1e-5

    def __post_init__(self) -> None:
        ls = np.atleast_1d(np.asarray(self.lengthscale, dtype=np.float64))
        for name, value in [
            ("lengthscale", float(ls.min()) if ls.size else float("nan")),
            ("signal_variance", self.signal_variance),
            ("noise_variance", self.noise_variance),
        ]:
            if not math.isfinite(value) or value <= 0:
                raise InputDataError(f"{name} must be a finite number > 0, got {value!r}")
        if not np.isfinite(ls).all():
            raise InputDataError("lengthscale must be finite")

    def as_dict(self) -> dict[str, float | list[float]]:
        ls = self.lengthscale
        return {
            "lengthscale": list(ls) if isinstance(ls, tuple) else float(ls),
            "signal_variance": float(self.signal_variance),
            "noise_variance": float(self.noise_variance),
        }


def se_kernel(A: FloatArray, B: FloatArray, hp: Hyperparameters) -> FloatArray:
    """``k(A, B) = s2 exp(-|a - b|^2 / (2 l^2))`` [len(A), len(B)] (GPML eq. 2.16)."""
    ls = np.asarray(hp.lengthscale, dtype=np.float64)
    a, b = A / ls, B / ls
    sq = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * (a @ b.T)
    np.maximum(sq, 0.0, out=sq)
    out: FloatArray = hp.signal_variance * np.exp(-0.5 * sq)
    return out


def median_distance(Z: FloatArray, max_points: int = 1000) -> float:
    """Median pairwise Euclidean distance of (an evenly spaced subsample of) the rows of Z."""
    n = Z.shape[0]
    idx = np.unique(np.linspace(0, n - 1, min(n, max_points)).astype(np.int64))
    S = Z[idx]
    sq = (S * S).sum(1)
    D = sq[:, None] + sq[None, :] - 2.0 * S @ S.T
    iu = np.triu_indices(len(idx), k=1)
    dist = np.sqrt(np.maximum(D[iu], 0.0))
    dist = dist[dist > 0]
    return float(np.median(dist)) if dist.size else 1.0


class GaussianProcess:
    """GP posterior over the fixed candidates Z, grown one observation at a time in O(n (t + r)).

    ``prior_mean`` is ``"zero"`` (m = 0, scikit-learn's default) or ``"empirical"`` (m = mean of the observed
    y, kept exact under updates through ``q = A^T L^{-1} 1``: mean = m + A^T L^{-1} y - m q).
    """

    def __init__(
        self,
        Z: npt.ArrayLike,
        hyperparameters: Hyperparameters,
        *,
        prior_mean: str = "zero",
        jitter: float = DEFAULT_JITTER,
        spill: Literal["auto", "always", "never"] = "auto",
        spill_directory: str | Path | None = None,
        factor_dtype: Literal["float64", "float32"] = "float64",
    ) -> None:
        Z = np.ascontiguousarray(Z, dtype=np.float64)
        if Z.ndim != 2 or Z.shape[0] < 1:
            raise InputDataError(f"Z must be a non-empty 2-D array, got shape {Z.shape}")
        if not np.isfinite(Z).all():
            raise InputDataError("Z must be finite")
        if prior_mean not in ("zero", "empirical"):
            raise InputDataError(f'prior_mean must be "zero" or "empirical", got {prior_mean!r}')
        self.Z = Z
        self.n = Z.shape[0]
        self.prior_mean = prior_mean
        self.jitter = float(jitter)
        self.spill, self.spill_directory = spill, spill_directory
        if factor_dtype not in ("float64", "float32"):
            raise InputDataError(f'factor_dtype must be "float64" or "float32", got {factor_dtype!r}')
        self.factor_dtype = factor_dtype
        self.hp = hyperparameters
        self._reset()

    # -- state -----------------------------------------------------------------------------------------
    def _reset(self) -> None:
        cap = 16
        self._idx = np.empty(cap, dtype=np.int64)
        self._y = np.empty(cap)
        self._L = np.zeros((cap, cap))
        if getattr(self, "_A", None) is None:
            self._A = FactorRows(
                self.n,
                spill=self.spill,
                spill_directory=self.spill_directory,
                dtype=np.float32 if self.factor_dtype == "float32" else np.float64,
            )
        self._A.clear()  # (its blocks are kept for the rebuild's rows)
        self._w = np.empty(cap)  # L^{-1} y
        self._u = np.empty(cap)  # L^{-1} 1
        self.t = 0
        self._p = np.zeros(self.n)  # A^T L^{-1} y
        self._q = np.zeros(self.n)  # A^T L^{-1} 1
        self._var = np.full(self.n, float(self.hp.signal_variance))
        self._scratch = np.empty(self.n)
        self._row = np.empty(self.n) if self.factor_dtype == "float32" else None  # the new row, in float64
        ls = np.asarray(self.hp.lengthscale, dtype=np.float64)
        r = self.Z.shape[1]
        # [Z / l ; -|Z / l|^2 / 2]^T as one [r + 1, n] array: k(Z_j, Z) is one dgemv over it (kernel_row)
        if getattr(self, "_ST", None) is None:
            self._ST = np.empty((r + 1, self.n))
        np.divide(self.Z.T, ls[:, None] if ls.ndim else ls, out=self._ST[:r])
        self._sqnorm = np.einsum("ij,ij->j", self._ST[:r], self._ST[:r])
        np.multiply(self._sqnorm, -0.5, out=self._ST[r])

    def _grow(self) -> None:
        """Double the capacity of the small per-observation arrays (A grows by blocks on its own)."""
        cap = 2 * self._idx.size
        idx, y, L, w, u = self._idx, self._y, self._L, self._w, self._u
        self._idx = np.empty(cap, dtype=np.int64)
        self._y, self._w, self._u = np.empty(cap), np.empty(cap), np.empty(cap)
        self._L = np.zeros((cap, cap))
        t = self.t
        self._idx[:t], self._y[:t], self._w[:t], self._u[:t] = idx[:t], y[:t], w[:t], u[:t]
        self._L[:t, :t] = L[:t, :t]

    @property
    def indices(self) -> npt.NDArray[np.int64]:
        return self._idx[: self.t].copy()

    @property
    def y(self) -> FloatArray:
        return self._y[: self.t].copy()

    @property
    def factor(self) -> FactorRows:
        """The stored factor A [t, n] (row blocks; see ``shared.bo.factor``)."""
        return self._A

    def _kernel_row_into(self, j: int, out: FloatArray) -> None:
        """``out <- k(Z_j, Z)`` [n]: one dgemv over ``[Z/l; -|Z/l|^2/2]`` gives ``z_i.z_j - |z_i|^2/2``;
        adding ``ln s2 - |z_j|^2/2`` makes it ``ln s2 - |z_i - z_j|^2/2``, clamped at ``ln s2`` (a distance
        is >= 0) and exponentiated, in one pass split across the cores. A subclass that overrides
        ``kernel_row`` (another kernel) is copied in instead."""
        if type(self).kernel_row is not GaussianProcess.kernel_row:
            out[:] = self.kernel_row(j)
            return
        from scipy.linalg.blas import dgemv

        r = self._ST.shape[0] - 1
        x = np.empty(r + 1)
        x[:r], x[r] = self._ST[:r, j], 1.0
        dgemv(1.0, self._ST.T, x, beta=0.0, y=out, overwrite_y=1)  # -|z_i|^2/2 + z_i . z_j
        log_s2 = math.log(self.hp.signal_variance)
        shift = float(self._ST[r, j]) + log_s2

        def finish(s: slice) -> None:
            part = out[s]
            np.add(part, shift, out=part)  # ln s2 - |z_i - z_j|^2 / 2
            np.minimum(part, log_s2, out=part)
            np.exp(part, out=part)

        split(finish, self.n)

    def kernel_row(self, j: int) -> FloatArray:
        """k(Z_j, Z) [n] in O(n r)."""
        out = np.empty(self.n)
        self._kernel_row_into(int(j), out)
        return out

    def kernel_rows(self, indices: npt.ArrayLike) -> FloatArray:
        """k(Z_p, Z) [p, n] for the rows ``indices`` in O(p n r) (vectorised ``kernel_row``)."""
        idx = np.atleast_1d(np.asarray(indices, dtype=np.int64))
        S = self._ST[:-1]
        sq = self._sqnorm[None, :] + self._sqnorm[idx, None] - 2.0 * (S[:, idx].T @ S)
        np.maximum(sq, 0.0, out=sq)
        out: FloatArray = self.hp.signal_variance * np.exp(-0.5 * sq)
        return out

    # -- updates ---------------------------------------------------------------------------------------
    def add(self, index: int, y: float) -> None:
        """Condition on y = f(Z_index) + noise: one rank-one growth of L and A, O(n (t + r)).

        The new row ``a = (k(Z_j, Z) - l^T A) / l_tt`` is built in place in A's next row (kernel row, then
        one accumulating dgemv per block of A: A is read once), and p, q and the variance are updated from
        it with BLAS axpy: about eight passes over n beside the read of A."""
        from scipy.linalg.blas import daxpy

        j = int(index)
        if not 0 <= j < self.n:
            raise InputDataError(f"index must be in [0, {self.n - 1}], got {index}")
        if not math.isfinite(float(y)):
            raise InputDataError(f"y must be finite, got {y!r}")
        if self.t == self._idx.size:
            self._grow()
        t = self.t
        # [n], filled in place: k(Z_j, Z), then the new row of A (in A's next row, or in float64 beside a
        # float32 factor, then stored rounded and read back so that p and the variance follow the stored A)
        a = self._A.next_row() if self._row is None else self._row
        self._kernel_row_into(j, a)
        k_old = a[self._idx[:t]]  # k(Z_I, Z_j) [t]
        L = self._L[:t, :t]
        lvec = solve_triangular(L, k_old, lower=True, check_finite=False) if t else np.empty(0)
        d2 = self.hp.signal_variance + self.hp.noise_variance + self.jitter - float(lvec @ lvec)
        l_tt = math.sqrt(max(d2, self.jitter))
        if self._row is None:
            self._A.gemv_into(lvec, a, alpha=-1.0 / l_tt, beta=1.0 / l_tt)  # a = (k_row - l^T A) / l_tt
        else:  # float32 factor: l^T A by sgemv, then a in float64, stored rounded and read back
            g, row, inv = self._A.project(lvec), self._A.next_row(), 1.0 / l_tt

            def make_row(s: slice) -> None:
                part = a[s]
                if g is not None:
                    np.subtract(part, g[s], out=part)
                part *= inv
                row[s] = part
                part[...] = row[s]

            split(make_row, self.n)
        w = (float(y) - float(lvec @ self._w[:t])) / l_tt
        u = (1.0 - float(lvec @ self._u[:t])) / l_tt
        self._L[t, :t], self._L[t, t] = lvec, l_tt
        self._w[t], self._u[t] = w, u
        self._idx[t], self._y[t] = j, float(y)
        daxpy(a, self._p, a=w)
        if self.prior_mean == "empirical":  # q is read only by an empirical prior mean
            daxpy(a, self._q, a=u)
        var, scratch = self._var, self._scratch

        def shrink(s: slice) -> None:
            np.multiply(a[s], a[s], out=scratch[s])
            np.subtract(var[s], scratch[s], out=var[s])

        split(shrink, self.n)
        self._A.commit()
        self.t = t + 1

    def refit(self, hyperparameters: Hyperparameters) -> None:
        """Replace the hyper-parameters and rebuild the posterior from the stored observations."""
        idx, y = self.indices, self.y
        self.hp = hyperparameters
        self._reset()
        self._rebuild(idx, y)

    def _rebuild(self, idx: npt.NDArray[np.int64], y: FloatArray) -> None:
        """Batch build (GPML Alg. 2.1), same state as t calls of ``add``: O(n t r + n t^2)."""
        t = idx.size
        if t == 0:
            return
        while self._idx.size < t:
            self._grow()
        Kxn = se_kernel(self.Z[idx], self.Z, self.hp)  # [t, n]
        K = Kxn[:, idx] + (self.hp.noise_variance + self.jitter) * np.eye(t)
        L = np.linalg.cholesky(K)
        A = solve_triangular(L, Kxn, lower=True, check_finite=False)
        w = solve_triangular(L, y, lower=True, check_finite=False)
        u = solve_triangular(L, np.ones(t), lower=True, check_finite=False)
        self._L[:t, :t], self._w[:t], self._u[:t] = L, w, u
        if self.factor_dtype == "float32":  # p and the variance follow the stored (rounded) factor
            A = A.astype(np.float32).astype(np.float64)
        self._A.load(A)
        self._idx[:t], self._y[:t] = idx, y
        self._p, self._q = A.T @ w, A.T @ u
        self._var = self.hp.signal_variance - np.einsum("ij,ij->j", A, A)
        self.t = t

    # -- posterior -------------------------------------------------------------------------------------
    @property
    def m(self) -> float:
        """The constant prior mean in use."""
        if self.prior_mean == "empirical" and self.t:
            return float(self._y[: self.t].mean())
        return 0.0

    def mean(self) -> FloatArray:
        """Posterior mean at every candidate [n] (GPML Alg. 2.1 line 4)."""
        m = self.m
        out: FloatArray = self._p + m * (1.0 - self._q) if m else self._p.copy()
        return out

    def variance(self) -> FloatArray:
        """Posterior variance of f at every candidate [n], clipped at 0 (GPML Alg. 2.1 line 6)."""
        out: FloatArray = np.maximum(self._var, 0.0)
        return out

    def covariance_rows(self, indices: npt.ArrayLike) -> FloatArray:
        """Posterior covariance ``k_t(Z_p, Z) = k(Z_p, Z) - A[:, p]^T A`` [p, n] (GPML eq. 2.24 with
        ``v = L^{-1} k``, Alg. 2.1 line 5), from the stored factor A: O(p n (t + r)), no refactorisation."""
        idx = np.atleast_1d(np.asarray(indices, dtype=np.int64))
        if idx.size and not (0 <= int(idx.min()) and int(idx.max()) < self.n):
            raise InputDataError(f"indices must be in [0, {self.n - 1}]")
        K = self.kernel_rows(idx)
        if self.t:
            K -= self._A.gram_rows(idx)
        return K

    def std(self) -> FloatArray:
        """Posterior standard deviation of f at every candidate [n] (GPML Alg. 2.1 line 6)."""
        out: FloatArray = np.sqrt(np.maximum(self._var, 0.0))
        return out

    def upper_confidence_bound(self, c: float, out: FloatArray | None = None) -> FloatArray:
        """``mean + c std`` at every candidate [n] (GP-UCB's acquisition with c = beta^1/2), into ``out`` or
        a new array: the arithmetic of ``mean() + c * std()`` in one pass over n, split across the cores."""
        res: FloatArray = np.empty(self.n) if out is None else out
        mean = self.mean() if self.m else self._p
        var, c = self._var, float(c)

        def fill(s: slice) -> None:
            part = res[s]
            np.maximum(var[s], 0.0, out=part)
            np.sqrt(part, out=part)
            np.multiply(part, c, out=part)
            np.add(mean[s], part, out=part)

        split(fill, self.n)
        return res

    def posterior_at(self, index: int) -> tuple[float, float]:
        """(mean, std) of f at one candidate, without computing them over all n."""
        i = int(index)
        m = self.m
        mean = float(self._p[i] + m * (1.0 - self._q[i])) if m else float(self._p[i])
        return mean, math.sqrt(max(float(self._var[i]), 0.0))


# -- maximum likelihood ---------------------------------------------------------------------------------
def _neg_log_marginal_likelihood(
    theta: FloatArray, D2: FloatArray, y: FloatArray, jitter: float
) -> tuple[float, FloatArray]:
    """-log p(y | theta) and its gradient in theta = (ln l, ln s2, ln noise) (GPML eqs. 2.30, 5.9)."""
    ell, s2, sn2 = np.exp(theta)
    t = y.size
    E = np.exp(-0.5 * D2 / ell**2)
    K = s2 * E + (sn2 + jitter) * np.eye(t)
    try:
        c = cho_factor(K, lower=True, check_finite=False)
    except np.linalg.LinAlgError:
        return 1e25, np.zeros(3)
    alpha = cho_solve(c, y, check_finite=False)
    logdet = 2.0 * np.log(np.diag(c[0])).sum()
    nll = 0.5 * float(y @ alpha) + 0.5 * logdet + 0.5 * t * math.log(2 * math.pi)
    W = np.outer(alpha, alpha) - cho_solve(c, np.eye(t), check_finite=False)
    dK = [s2 * E * D2 / ell**2, s2 * E, sn2 * np.eye(t)]  # dK/d ln(param)
    grad = np.array([-0.5 * float(np.einsum("ij,ji->", W, g)) for g in dK])
    return nll, grad


def fit_hyperparameters(
    Z: FloatArray,
    idx: npt.ArrayLike,
    y: npt.ArrayLike,
    *,
    initial: Hyperparameters | None = None,
    jitter: float = DEFAULT_JITTER,
    restarts: int = 3,
    distance_scale: float | None = None,
) -> Hyperparameters:
    """Type-II maximum likelihood for (lengthscale, signal variance, noise variance), isotropic.

    L-BFGS-B (scipy.optimize) over the log-parameters with analytic gradients, within bounds relative to
    the data: lengthscale in [0.05, 20] x the median pairwise distance of Z, signal variance in
    [1e-3, 1e3] x var(y), noise variance in [1e-6, 1] x var(y). Deterministic restarts (lengthscale
    x {1, 1/4, 4} of the initial guess) so the result is a function of the data alone (rebuildable state).
    ``y`` is expected already centred if a constant mean is used. ``distance_scale`` (the median pairwise
    distance of Z) may be passed in to skip recomputing it.
    """
    Zi = np.asarray(Z, dtype=np.float64)[np.asarray(idx, dtype=np.int64)]
    y = np.asarray(y, dtype=np.float64)
    med = distance_scale if distance_scale is not None else median_distance(np.asarray(Z, dtype=np.float64))
    var_y = float(np.var(y)) if y.size > 1 and np.var(y) > 0 else 1.0
    sq = (Zi * Zi).sum(1)
    D2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * Zi @ Zi.T, 0.0)
    bounds = [
        (math.log(5e-2 * med), math.log(2e1 * med)),
        (math.log(1e-3 * var_y), math.log(1e3 * var_y)),
        (math.log(1e-6 * var_y), math.log(1.0 * var_y)),
    ]
    if initial is None:
        initial = Hyperparameters(lengthscale=med, signal_variance=var_y, noise_variance=1e-2 * var_y)
    ls0 = float(np.mean(np.atleast_1d(initial.lengthscale)))
    starts = [
        np.array([math.log(ls0 * f), math.log(initial.signal_variance), math.log(initial.noise_variance)])
        for f in (1.0, 0.25, 4.0)[: max(1, restarts)]
    ]
    best: tuple[float, FloatArray] | None = None
    from scipy.optimize import minimize  # (imported when first used: a service starts without it)

    for x0 in starts:
        x0 = np.clip(x0, [b[0] for b in bounds], [b[1] for b in bounds])
        res = minimize(
            _neg_log_marginal_likelihood,
            x0,
            args=(D2, y, jitter),
            jac=True,
            method="L-BFGS-B",
            bounds=bounds,
        )
        if np.isfinite(res.fun) and (best is None or res.fun < best[0]):
            best = (float(res.fun), res.x)
    theta = best[1] if best is not None else starts[0]
    ell, s2, sn2 = np.exp(theta)
    return replace(initial, lengthscale=float(ell), signal_variance=float(s2), noise_variance=float(sn2))
