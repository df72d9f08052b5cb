"""Exact GP regression over a fixed, discrete candidate set, updated incrementally.

The modeler's belief in PO-GP-UCB (Kharkovskii et al. 2020, Alg. 2 line 6) is the GP posterior over the n
released rows. Formulas from Rasmussen & Williams, *Gaussian Processes for Machine Learning* (2006), Alg. 2.1
(p. 19) and eq. 2.30 / 5.9 (log marginal likelihood and its gradient).

Notation (shapes in brackets)::

    Z        [n, r]  candidates (fixed); an observation is (i, y): row i of Z and its measured value y
    k(z, z') = s2 exp(-|z - z'|^2 / (2 l^2))      squared exponential (``shared.bo.kernels``); anisotropic l
                                                  by rescaling Z
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
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy.linalg import solve_triangular

from shared.bo.factor import FactorRows
from shared.bo.float32_bounds import F32_UNIT, Float32Bounds
from shared.bo.kernels import se_finish_log, se_from_sqdist, se_matrix, sqdist_from_gram
from shared.bo.parallel import argmax
from shared.bo.partition import Partition, StepMessage
from shared.errors import InputDataError

FloatArray = npt.NDArray[np.float64]

__all__ = ["GaussianProcess", "Hyperparameters", "median_distance", "se_kernel"]

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
    """``k(A, B) = s2 exp(-|a - b|^2 / (2 l^2))`` [len(A), len(B)] (GPML eq. 2.16; ``shared.bo.kernels``)."""
    return se_matrix(A, B, hp.lengthscale, hp.signal_variance)


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


class GaussianProcess(Float32Bounds):
    """GP posterior over the fixed candidates Z, grown one observation at a time in O(n (t + r)).

    ``prior_mean`` is ``"zero"`` (m = 0, scikit-learn's default) or ``"empirical"`` (m = mean of the observed
    y, kept exact under updates through ``q = A^T L^{-1} 1``: mean = m + A^T L^{-1} y - m q).
    """

    hp: Hyperparameters

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
        self._w = np.empty(cap)  # L^{-1} y
        self._u = np.empty(cap)  # L^{-1} 1
        self._err = np.zeros(cap)  # float32 factor: bounds on |stored row - float64 row| (``float32_bounds``)
        self.t = 0
        if getattr(self, "_part", None) is None:
            # every per-candidate array (the factor A, p, q, the variance, [Z/l; -|Z/l|^2/2]): one partition
            # over all n (``shared.bo.partition``, the same code as each partition of a distributed loop)
            self._part = Partition(
                self.Z,
                self.hp.signal_variance,
                self.hp.lengthscale,
                empirical=self.prior_mean == "empirical",
                factor_dtype=self.factor_dtype,  # type: ignore[arg-type]
                spill=self.spill,
                spill_directory=self.spill_directory,
            )
        else:
            self._part.reset(self.hp.signal_variance, self.hp.lengthscale)
        part = self._part
        self._A, self._ST, self._sqnorm = part.A, part.ST, part.sqnorm
        self._p, self._q, self._var, self._ucb = part.p, part.q, part.var, part.ucb
        self._row = part._row  # the float64 work row beside a float32 factor (None: float64)
        self._ucb_for: tuple[int, float] | None = None  # (t, c) of the values in _ucb, while valid

    def _grow(self) -> None:
        """Double the capacity of the small per-observation arrays (A grows by blocks on its own)."""
        cap = 2 * self._idx.size
        idx, y, L, w, u, err = self._idx, self._y, self._L, self._w, self._u, self._err
        self._idx = np.empty(cap, dtype=np.int64)
        self._y, self._w, self._u, self._err = np.empty(cap), np.empty(cap), np.empty(cap), np.zeros(cap)
        self._err[: self.t] = err[: self.t]
        self._L = np.zeros((cap, cap))
        t = self.t
        self._idx[:t], self._y[:t], self._w[:t], self._u[:t] = idx[:t], y[:t], w[:t], u[:t]
        self._L[:t, :t] = L[:t, :t]

    @property
    def indices(self) -> npt.NDArray[np.int64]:
        return self._idx[: self.t].copy()

    def rows(self, indices: npt.ArrayLike) -> FloatArray:
        """``Z[indices]`` [p, r] (a copy)."""
        out: FloatArray = self.Z[np.asarray(indices, dtype=np.int64)]
        return out

    @property
    def y(self) -> FloatArray:
        return self._y[: self.t].copy()

    @property
    def factor(self) -> FactorRows:
        """The stored factor A [t, n] (row blocks; see ``shared.bo.factor``)."""
        return self._A

    def _kernel_factors(self, j: int) -> tuple[FloatArray, float, float] | None:
        """``(x, shift, ln s2)`` with which ``k(Z_j, Z)`` is ``se_finish_log(x^T [Z/l; -|Z/l|^2/2], shift,
        ln s2)`` (``shared.bo.kernels``, ``Partition.kernel_factors``). None when a subclass overrides
        ``kernel_row`` (another kernel)."""
        if type(self).kernel_row is not GaussianProcess.kernel_row:
            return None
        log_s2 = math.log(self.hp.signal_variance)
        x, shift = self._part.kernel_factors(j, log_s2)
        return x, shift, log_s2

    def _st_columns(self, idx: npt.NDArray[np.int64]) -> FloatArray:
        """The columns ``idx`` of ``[Z/l; -|Z/l|^2/2]`` [r + 1, len(idx)], in Fortran order (numpy's layout
        of ``ST[:, idx]``; the product with them is one BLAS call whose summation order follows it)."""
        out: FloatArray = np.asfortranarray(self._ST[:, idx])
        return out

    def _kernel_row_into(self, j: int, out: FloatArray) -> None:
        """``out <- k(Z_j, Z)`` [n] (``_kernel_factors``, ``_kernel_row_whole``). A subclass that overrides
        ``kernel_row`` (another kernel) is copied in instead."""
        factors = self._kernel_factors(j)
        if factors is None:
            out[:] = self.kernel_row(j)
        else:
            self._kernel_row_whole(factors, out)

    def _kernel_row_whole(self, factors: tuple[FloatArray, float, float], out: FloatArray) -> None:
        """The kernel row over all n (``Partition._kernel_row_whole``)."""
        self._part._kernel_row_whole(factors, out)

    def _other_kernel_row(self, j: int, idx: npt.NDArray[np.int64]) -> FloatArray:
        """Another kernel's step (``kernel_row`` overridden): its row k(Z_j, Z) into the partition's row
        buffer, and ``k(Z_I, Z_j)`` [t] read from it (``shared.bo.dask_gp`` sends the partitions the kernel
        instead and computes the t entries itself)."""
        a = self._part.row_buffer()
        a[:] = self.kernel_row(j)
        out: FloatArray = a[idx]
        return out

    def kernel_row(self, j: int) -> FloatArray:
        """k(Z_j, Z) [n] in O(n r)."""
        out = np.empty(self.n)
        self._kernel_row_into(int(j), out)
        return out

    def kernel_rows(self, indices: npt.ArrayLike) -> FloatArray:
        """k(Z_p, Z) [p, n] for the rows ``indices`` in O(p n r) (vectorised ``kernel_row``)."""
        idx = np.atleast_1d(np.asarray(indices, dtype=np.int64))
        S = self._ST[:-1]
        sq = sqdist_from_gram(self._sqnorm[idx], self._sqnorm, S[:, idx].T @ S)
        return se_from_sqdist(sq, self.hp.signal_variance, out=sq)

    # -- updates ---------------------------------------------------------------------------------------
    def add(self, index: int, y: float, *, ucb_scale: float | None = None) -> None:
        """Condition on y = f(Z_index) + noise: one rank-one growth of L and A, O(n (t + r)).

        The new row ``a = (k(Z_j, Z) - l^T A) / l_tt`` is built in place in A's next row by one pass over n,
        chunk by chunk (``_update``): the kernel row and ``l^T A`` on the chunk (Z and A are read once),
        the new row, and p, q and the variance updated from it. With ``ucb_scale`` c, the same pass also
        writes ``mean + c std`` of the updated posterior, which ``ucb_values(c)`` then returns without
        another pass (GP-UCB's next acquisition)."""
        j = int(index)
        if not 0 <= j < self.n:
            raise InputDataError(f"index must be in [0, {self.n - 1}], got {index}")
        if not math.isfinite(float(y)):
            raise InputDataError(f"y must be finite, got {y!r}")
        if self.t == self._idx.size:
            self._grow()
        t = self.t
        # [n]: A's next row, or the float64 work row beside a float32 factor (the new row is then stored
        # rounded and read back, so that p and the variance follow the stored A)
        factors = self._kernel_factors(j)
        idx = self._idx[:t]
        if factors is None:  # another kernel: its row, whole
            k_old = self._other_kernel_row(j, idx)
        else:  # k(Z_I, Z_j) [t] from the same product and element-wise steps as the pass's
            k_old = factors[0] @ self._st_columns(idx)
            se_finish_log(k_old, *factors[1:])
        L = self._L[:t, :t]
        lvec = solve_triangular(L, k_old, lower=True, check_finite=False) if t else np.empty(0)
        d2 = self.hp.signal_variance + self.hp.noise_variance + self.jitter - float(lvec @ lvec)
        l_tt = math.sqrt(max(d2, self.jitter))
        w = (float(y) - float(lvec @ self._w[:t])) / l_tt
        u = (1.0 - float(lvec @ self._u[:t])) / l_tt
        self._L[t, :t], self._L[t, t] = lvec, l_tt
        self._w[t], self._u[t] = w, u
        self._idx[t], self._y[t] = j, float(y)
        if self._row is not None:
            self._err[t] = self._row_error_bound(lvec, l_tt)
        m = float(self._y[: t + 1].mean()) if self.prior_mean == "empirical" else 0.0  # self.m at t + 1
        ucb = None if ucb_scale is None else (float(ucb_scale), m)
        x, shift, log_s2 = factors if factors is not None else (None, 0.0, 0.0)
        self._part.update(StepMessage(t, x, shift, log_s2, lvec, w, u, 1.0 / l_tt, ucb))
        self.t = t + 1
        self._ucb_for = None if ucb_scale is None else (self.t, float(ucb_scale))

    def refit(self, hyperparameters: Hyperparameters) -> None:
        """Replace the hyper-parameters and rebuild the posterior from the stored observations."""
        idx, y = self.indices, self.y
        self.hp = hyperparameters
        self._reset()
        self._rebuild(idx, y)

    def _rebuild(self, idx: npt.NDArray[np.int64], y: FloatArray) -> None:
        """Batch build (GPML Alg. 2.1), same state as t calls of ``add``: L, L^{-1} y and L^{-1} 1 here
        (O(t^3)), the factor and the per-candidate arrays in ``Partition.rebuild`` (O(n t r + n t^2))."""
        t = idx.size
        if t == 0:
            return
        while self._idx.size < t:
            self._grow()
        L, w, u = self._batch_factor(self.Z[idx], y)
        self._L[:t, :t], self._w[:t], self._u[:t] = L, w, u
        float32 = self.factor_dtype == "float32"
        if float32:  # p and the variance follow the stored (rounded) factor
            self._err[:t] = F32_UNIT * math.sqrt(self.hp.signal_variance)  # one rounding of |A| <= s
        self._part.rebuild(self.Z[idx], L, w, u, self.hp.signal_variance, self.hp.lengthscale, float32)
        self._idx[:t], self._y[:t] = idx, y
        self.t = t

    def _batch_factor(self, Z_obs: FloatArray, y: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
        """(L, L^{-1} y, L^{-1} 1) of the observations at ``Z_obs`` [t, r]: K = k(Z_obs, Z_obs) + (noise +
        jitter) Id = L L^T (GPML Alg. 2.1 line 2)."""
        t = Z_obs.shape[0]
        K = se_kernel(Z_obs, Z_obs, self.hp) + (self.hp.noise_variance + self.jitter) * np.eye(t)
        L = np.asarray(np.linalg.cholesky(K), dtype=np.float64)
        w = solve_triangular(L, y, lower=True, check_finite=False)
        u = solve_triangular(L, np.ones(t), lower=True, check_finite=False)
        return L, w, u

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

    def variance_at(self, index: int) -> float:
        """``variance()[index]`` without the other n - 1 values (a distributed GP asks one partition)."""
        return float(np.maximum(self._var[int(index)], 0.0))

    def std(self) -> FloatArray:
        """Posterior standard deviation of f at every candidate [n] (GPML Alg. 2.1 line 6)."""
        out: FloatArray = np.sqrt(np.maximum(self._var, 0.0))
        return out

    def upper_confidence_bound(self, c: float, out: FloatArray | None = None) -> FloatArray:
        """``mean + c std`` at every candidate [n] (GP-UCB's acquisition with c = beta^1/2), into ``out`` or
        a new array: the arithmetic of ``mean() + c * std()``, in one chunked pass over n split across the
        cores (``Partition.ucb_slice``)."""
        res: FloatArray = np.empty(self.n) if out is None else out
        return self._part.upper_confidence_bound(float(c), self.m, res)

    def ucb_values(self, c: float) -> FloatArray:
        """``mean + c std`` [n] in the GP's own acquisition buffer: the values the last ``add(...,
        ucb_scale=c)`` computed when nothing changed since, else computed now. The buffer is the caller's to
        modify until the next call (GP-UCB writes -inf at queried rows), so a second call recomputes."""
        c = float(c)
        if self._ucb_for != (self.t, c):
            self.upper_confidence_bound(c, out=self._ucb)
        self._ucb_for = None
        out: FloatArray = self._ucb
        return out

    def ucb_argmax(self, c: float, excluded: npt.NDArray[np.int64]) -> tuple[int, float]:
        """(index, value) of the first maximum of ``mean + c std`` over the candidates not in ``excluded``, as
        ``np.argmax`` picks it (ties: the smallest index; the first NaN if any): GP-UCB's choice (PO-GP-UCB
        Alg. 2 line 4). A distributed GP answers it without gathering the n values."""
        ucb = self.ucb_values(c)
        ucb[excluded] = -np.inf
        i = argmax(ucb)
        return i, float(ucb[i])

    def posterior_at(self, index: int) -> tuple[float, float]:
        """(mean, std) of f at one candidate, without computing them over all n."""
        return self._part.posterior_at(int(index), self.m)
