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
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy.linalg import solve_triangular

from shared.bo.factor import SPARE_MIN_BYTES, FactorRows, give_back, take_spare
from shared.bo.float32_bounds import F32_UNIT, Float32Bounds
from shared.bo.kernels import se_finish_log, se_from_sqdist, se_matrix, sqdist_from_gram
from shared.bo.parallel import CHUNK, chunk_buffer, in_parallel, split
from shared.errors import InputDataError

FloatArray = npt.NDArray[np.float64]

__all__ = ["GaussianProcess", "Hyperparameters", "median_distance", "se_kernel"]

#: Added to the diagonal of K (beside the noise variance) for numerical stability.
DEFAULT_JITTER = 1e-10

#: Rows of Z transposed at a time into ``[Z/l; ...]`` (15 float64 columns: 240 KB, within a core's L2).
TILE = 2048


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


def _work_array(shape: tuple[int, int]) -> FloatArray:
    """A float64 array of ``shape``: a spare one (``shared.bo.factor``) when it is large, else new."""
    spare = take_spare(shape, np.dtype(np.float64)) if 8 * shape[0] * shape[1] >= SPARE_MIN_BYTES else None
    out: FloatArray = spare if spare is not None else np.empty(shape)
    return out


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
        self._err = np.zeros(cap)  # float32 factor: bounds on |stored row - float64 row| (``float32_bounds``)
        self.t = 0
        r = self.Z.shape[1]
        if getattr(self, "_work", None) is None:
            # The per-candidate arrays and [Z/l; -|Z/l|^2/2]: large ones are taken from the arrays a released
            # GP over the same n gave back (fresh memory costs more to touch than to read, see
            # ``shared.bo.factor``) and given back when this GP is collected.
            rows = 6 if self.factor_dtype == "float32" else 5
            self._work, self._ST = _work_array((rows, self.n)), _work_array((r + 1, self.n))
            kept = [a for a in (self._work, self._ST) if a.nbytes >= SPARE_MIN_BYTES]
            if kept:
                weakref.finalize(self, give_back, kept)
        self._p, self._q, self._var = self._work[0], self._work[1], self._work[2]  # A^T L^-1 y, A^T L^-1 1
        self._scratch, self._ucb = self._work[3], self._work[4]
        self._row = self._work[5] if self.factor_dtype == "float32" else None  # the new row, in float64
        self._p.fill(0.0)
        self._q.fill(0.0)
        self._var.fill(float(self.hp.signal_variance))
        self._ucb_for: tuple[int, float] | None = None  # (t, c) of the values in _ucb, while valid
        ls = np.asarray(self.hp.lengthscale, dtype=np.float64)
        # [Z / l ; -|Z / l|^2 / 2]^T as one [r + 1, n] array: k(Z_j, Z) is one dgemv over it (kernel_row)
        scale = ls[:, None] if ls.ndim else ls
        Z, ST = self.Z, self._ST

        def transpose(s: slice) -> None:  # in tiles that stay in cache (one strided pass: 3-4x slower)
            for start in range(s.start, s.stop, TILE):
                tile = slice(start, min(start + TILE, s.stop))
                np.divide(Z[tile].T, scale, out=ST[:r, tile])

        split(transpose, self.n)
        self._sqnorm = np.einsum("ij,ij->j", self._ST[:r], self._ST[:r])
        np.multiply(self._sqnorm, -0.5, out=self._ST[r])

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

    @property
    def y(self) -> FloatArray:
        return self._y[: self.t].copy()

    @property
    def factor(self) -> FactorRows:
        """The stored factor A [t, n] (row blocks; see ``shared.bo.factor``)."""
        return self._A

    def _kernel_factors(self, j: int) -> tuple[FloatArray, float, float] | None:
        """``(x, shift, ln s2)`` with which ``k(Z_j, Z)`` is ``se_finish_log(x^T [Z/l; -|Z/l|^2/2], shift,
        ln s2)`` (``shared.bo.kernels``): x = [z_j/l; 1] makes the product ``z_i.z_j - |z_i|^2/2``, and adding
        ``shift = ln s2 - |z_j|^2/2`` makes it ``ln s2 - |z_i - z_j|^2/2``. None when a subclass overrides
        ``kernel_row`` (another kernel)."""
        if type(self).kernel_row is not GaussianProcess.kernel_row:
            return None
        r = self._ST.shape[0] - 1
        x = np.empty(r + 1)
        x[:r], x[r] = self._ST[:r, j], 1.0
        log_s2 = math.log(self.hp.signal_variance)
        return x, float(self._ST[r, j]) + log_s2, log_s2

    def _kernel_row_into(self, j: int, out: FloatArray) -> None:
        """``out <- k(Z_j, Z)`` [n] (``_kernel_factors``, ``_kernel_row_whole``). A subclass that overrides
        ``kernel_row`` (another kernel) is copied in instead."""
        factors = self._kernel_factors(j)
        if factors is None:
            out[:] = self.kernel_row(j)
        else:
            self._kernel_row_whole(factors, out)

    def _kernel_row_whole(self, factors: tuple[FloatArray, float, float], out: FloatArray) -> None:
        """The kernel row over all n: one dgemv over ``[Z/l; -|Z/l|^2/2]``, then the clamp at ``ln s2`` (a
        distance is >= 0) and the exponential in one pass split across the cores."""
        from scipy.linalg.blas import dgemv

        x, shift, log_s2 = factors
        dgemv(1.0, self._ST.T, x, beta=0.0, y=out, overwrite_y=1)
        split(lambda s: se_finish_log(out[s], shift, log_s2), self.n, chunk=CHUNK)

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
        a = self._A.next_row() if self._row is None else self._row
        factors = self._kernel_factors(j)
        idx = self._idx[:t]
        if factors is None:  # another kernel: its row, whole
            a[:] = self.kernel_row(j)
            k_old = a[idx]
        else:  # k(Z_I, Z_j) [t] from the same product and element-wise steps as the pass's
            k_old = factors[0] @ self._ST[:, idx]
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
        self._update(a, factors, lvec, (w, u, 1.0 / l_tt), ucb)
        self._A.commit()
        self.t = t + 1
        self._ucb_for = None if ucb_scale is None else (self.t, float(ucb_scale))

    def _update(
        self,
        a: FloatArray,
        kernel: tuple[FloatArray, float, float] | None,
        lvec: FloatArray,
        coefficients: tuple[float, float, float],
        ucb: tuple[float, float] | None,
    ) -> None:
        """The step's one chunked pass over n, split across the cores: on each chunk, the kernel row
        (``kernel``: ``_kernel_factors``' product over the chunk's candidates and ``se_finish_log``; None:
        ``a`` holds it already), ``g = l^T A`` over the chunk's columns (one BLAS gemv per block of A, in the
        factor's precision: A is read once, the chunk's g used while in cache), the new row ``a <- (k - g)
        inv`` (float32 factor: stored rounded in A's next row and read back), ``p += w a``, ``q += u a``
        (empirical prior mean only), ``var -= a^2``, and with ``ucb = (c, m)`` the acquisition ``mean + c
        std`` into ``_ucb``. Below MIN_PARALLEL (one slice) the two products run over all n first."""
        w, u, inv = coefficients
        p, q, var, ST = self._p, self._q, self._var, self._ST
        empirical = self.prior_mean == "empirical"
        row = None if self._row is None else self._A.next_row()
        x = lvec.astype(self._A.dtype) if lvec.size else None
        dtype = self._A.dtype
        whole, formed = None, False
        if not in_parallel(self.n):
            # One slice: the kernel row's dgemv and l^T A each in one BLAS call per array over all n first,
            # so BLAS keeps its threads busy (called chunk by chunk they sleep between the calls: measured,
            # the n = 100 000 loop 1.15x slower). A float64 factor's row is formed in BLAS, as ``y <- beta y
            # + alpha x^T A`` with the kernel values finished first (that loop 1.04x faster than in the pass).
            if kernel is not None:
                self._kernel_row_whole(kernel, a)
                kernel = None
            if row is None:
                self._A.gemv_into(lvec, a, alpha=-inv, beta=inv)
                formed = True
            elif x is not None:
                whole = self._A.project(x)

        def run(s: slice) -> None:
            size = s.stop - s.start
            # the chunk's temporaries are the thread's own (in cache, never written back to an [n] array);
            # float32 factor: ``a`` (the float64 work row) is only read, the row goes to A rounded
            tmp = chunk_buffer("tmp", np.dtype(np.float64), size)
            part = a[s] if row is None else chunk_buffer("row", np.dtype(np.float64), size)
            if kernel is not None:
                np.matmul(kernel[0], ST[:, s], out=part)
                se_finish_log(part, kernel[1], kernel[2])
            elif row is not None:
                part[...] = a[s]
            if whole is not None:
                np.subtract(part, whole[s], out=part)
            elif x is not None and not formed:
                g = chunk_buffer("g", dtype, size)
                self._A.project_columns(x, s, g, chunk_buffer("g_block", dtype, size))
                np.subtract(part, g, out=part)
            if row is not None:
                np.multiply(part, inv, out=row[s], casting="same_kind")  # in float64, stored rounded
                part[...] = row[s]
            elif not formed:
                np.multiply(part, inv, out=part)
            np.multiply(part, w, out=tmp)
            np.add(p[s], tmp, out=p[s])
            if empirical:
                np.multiply(part, u, out=tmp)
                np.add(q[s], tmp, out=q[s])
            np.multiply(part, part, out=tmp)
            np.subtract(var[s], tmp, out=var[s])
            if ucb is not None:
                self._ucb_slice(s, ucb[0], ucb[1], self._ucb)

        split(run, self.n, chunk=CHUNK, blas=True)

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
            self._err[:t] = F32_UNIT * math.sqrt(self.hp.signal_variance)  # one rounding of |A| <= s
        self._A.load(A)
        self._idx[:t], self._y[:t] = idx, y
        np.matmul(A.T, w, out=self._p)
        np.matmul(A.T, u, out=self._q)
        np.einsum("ij,ij->j", A, A, out=self._var)
        np.subtract(self.hp.signal_variance, self._var, out=self._var)
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
        a new array: the arithmetic of ``mean() + c * std()``, in one chunked pass over n split across the
        cores."""
        res: FloatArray = np.empty(self.n) if out is None else out
        m, c = self.m, float(c)
        split(lambda s: self._ucb_slice(s, c, m, res), self.n, chunk=CHUNK)
        return res

    def _ucb_slice(self, s: slice, c: float, m: float, res: FloatArray) -> None:
        """``res[s] = mean + c sqrt(max(var, 0))`` with ``mean = p + m (1 - q)`` (p when m = 0), in the order
        of ``mean() + c * std()`` (bit for bit)."""
        part = res[s]
        np.maximum(self._var[s], 0.0, out=part)
        np.sqrt(part, out=part)
        np.multiply(part, c, out=part)
        if m:
            mean = self._scratch[s]
            np.subtract(1.0, self._q[s], out=mean)
            np.multiply(mean, m, out=mean)
            np.add(self._p[s], mean, out=mean)
            np.add(mean, part, out=part)
        else:
            np.add(self._p[s], part, out=part)

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

    def posterior_at(self, index: int) -> tuple[float, float]:
        """(mean, std) of f at one candidate, without computing them over all n."""
        i = int(index)
        m = self.m
        mean = float(self._p[i] + m * (1.0 - self._q[i])) if m else float(self._p[i])
        return mean, math.sqrt(max(float(self._var[i]), 0.0))
