"""A GP posterior's per-candidate part over one contiguous range of the candidates: the one place its step,
rebuild and acquisition are computed, whether the range is all n (``shared.bo.gp.GaussianProcess``, one
process) or one partition of many (``shared.bo.dask_gp``, a Dask worker each).

Notation of ``shared.bo.gp`` (GPML Alg. 2.1; Rasmussen & Williams 2006): a partition over rows ``start ..
start + n_p - 1`` of Z keeps ``[Z/l; -|Z/l|^2/2]`` [r + 1, n_p] (``ST``), its columns of the factor
``A = L^{-1} k(Z_I, Z)`` [t, n_p] (``shared.bo.factor``), and ``p = A^T w``, ``q = A^T u`` and the
variance ``s2 - sum_rows A^2`` [n_p]. The O(t^2) part (L, w = L^{-1} y, u = L^{-1} 1, the observed rows)
belongs to whoever drives the loop. One step of GP-UCB needs from the driver only ``StepMessage``: the
chosen row's kernel factors (r + 2 numbers), ``l = L^{-1} k(Z_I, z_j)`` [t] and three scalars. Every
partition then forms its columns of the new row with the same formula,

    a = (k(z_j, Z) - l^T A) / l_tt                       (GPML Alg. 2.1 line 5, grown by one row)

updates p, q and the variance from it, and writes ``mean + c std`` (GP-UCB's acquisition, Srinivas et al.
2010; PO-GP-UCB Alg. 2 line 4) for the next choice. Each candidate's numbers are computed by the same
operations on the same inputs whatever range it sits in: the products are BLAS gemv over a chunk of
columns (per column a dot product over the r + 1 or t rows, summed block by block of the factor's rows),
and everything else is element-wise. Run with BLAS on one thread inside a chunk (a threaded gemv may
split its columns at other places) and with ranges starting at multiples of ``ALIGN`` rows, a partitioned
loop makes the same choices, with the same acquisition values bit for bit, as the single-process loop.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from scipy.linalg import solve_triangular

from shared.bo.factor import SPARE_MIN_BYTES, FactorRows, give_back, take_spare
from shared.bo.kernels import kernel_matrix, se_finish_log, se_from_sqdist, se_matrix, sqdist_from_gram
from shared.bo.parallel import CHUNK, argmax, chunk_buffer, in_parallel, split

FloatArray = npt.NDArray[np.float64]

__all__ = ["ALIGN", "TILE", "Partition", "StepMessage", "kernel_factors", "partition_bounds"]

#: Partition borders sit at multiples of this many rows (SIMD kernels' column groups never straddle one).
ALIGN = 64

#: Rows of Z transposed at a time into ``[Z/l; ...]`` (15 float64 columns: 240 KB, within a core's L2).
TILE = 2048


def partition_bounds(n: int, parts: int, *, align: int = ALIGN) -> list[tuple[int, int]]:
    """``parts`` contiguous ranges covering ``range(n)``, every border at a multiple of ``align`` (so the
    last range may be shorter, and fewer ranges come back when n is small); empty ranges are dropped."""
    if n < 1 or parts < 1:
        raise ValueError(f"n and parts must be >= 1, got n={n}, parts={parts}")
    blocks = -(-n // align)
    edges = sorted({min(n, align * (blocks * k // parts)) for k in range(parts + 1)})
    return [(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True) if b > a]


def _work_array(shape: tuple[int, int]) -> FloatArray:
    """A float64 array of ``shape``: a spare one (``shared.bo.factor``) when it is large, else new."""
    spare = take_spare(shape, np.dtype(np.float64)) if 8 * shape[0] * shape[1] >= SPARE_MIN_BYTES else None
    out: FloatArray = spare if spare is not None else np.empty(shape)
    return out


@dataclass(frozen=True)
class StepMessage:
    """What the driver sends every partition for one observation (about 8 (t + r) bytes).

    ``x``, ``shift``, ``log_s2``: the chosen row's kernel factors (``GaussianProcess._kernel_factors``), or
    ``x`` None when the caller has put another kernel's row into ``Partition.row_buffer()`` itself, or when
    ``row`` = (kind, lengthscale, z_j) names another kernel (``shared.bo.kernels.RowKernel``: SE or Matern-5/2
    from ``scaled_sqdist``, each entry a function of its two rows alone) whose row the partition forms over
    its own range (``shared.bo.dask_gp``: the heavy-tailed / LDP strategies' ``KernelGP`` on Dask).
    ``lvec`` = L^{-1} k(Z_I, z_j) [t]; ``w``, ``u``: the new entries of L^{-1} y and L^{-1} 1; ``inv`` =
    1 / l_tt; ``ucb``: (c, m) to write ``mean + c std`` in the same pass, or None.
    """

    t: int
    x: FloatArray | None
    shift: float
    log_s2: float
    lvec: FloatArray
    w: float
    u: float
    inv: float
    ucb: tuple[float, float] | None
    row: tuple[str, float, FloatArray] | None = None


def kernel_factors(column: FloatArray, log_s2: float) -> tuple[FloatArray, float]:
    """(x, shift) of a candidate for ``StepMessage`` from its column of ``[Z/l; -|Z/l|^2/2]``: ``x = [z_j/l;
    1]`` and ``shift = ln s2 - |z_j/l|^2/2`` make ``x^T ST + shift = ln s2 - |z_i - z_j|^2 / (2 l^2)``."""
    r = column.shape[0] - 1
    x = np.empty(r + 1)
    x[:r], x[r] = column[:r], 1.0
    return x, float(column[r]) + log_s2


class Partition:
    """The per-candidate state of a GP over ``Z`` [n_p, r] (rows ``start ..`` of the candidates)."""

    def __init__(
        self,
        Z: FloatArray,
        signal_variance: float,
        lengthscale: float | tuple[float, ...] | FloatArray,
        *,
        start: int = 0,
        empirical: bool = False,
        factor_dtype: Literal["float64", "float32"] = "float64",
        spill: Literal["auto", "always", "never"] = "auto",
        spill_directory: str | Path | None = None,
        reuse_memory: bool = True,
    ) -> None:
        self.Z = Z
        self.start = int(start)
        self.factor_dtype = factor_dtype
        self.reuse_memory = reuse_memory
        self.n = int(Z.shape[0])
        self.empirical = empirical
        self.A = FactorRows(
            self.n,
            spill=spill,
            spill_directory=spill_directory,
            dtype=np.float32 if factor_dtype == "float32" else np.float64,
            reuse=reuse_memory,
        )
        # The per-candidate arrays and [Z/l; -|Z/l|^2/2]: large ones are taken from the arrays a released GP
        # over the same n gave back (fresh memory costs more to touch than to read, see ``shared.bo.factor``)
        # and given back when this partition is collected.
        rows = 6 if factor_dtype == "float32" else 5
        if reuse_memory:
            self._work, self.ST = _work_array((rows, self.n)), _work_array((Z.shape[1] + 1, self.n))
            kept = [a for a in (self._work, self.ST) if a.nbytes >= SPARE_MIN_BYTES]
            if kept:
                weakref.finalize(self, give_back, kept)
        else:
            self._work, self.ST = np.empty((rows, self.n)), np.empty((Z.shape[1] + 1, self.n))
        self._alias()
        self.reset(signal_variance, lengthscale)

    def _alias(self) -> None:
        self.p, self.q, self.var = self._work[0], self._work[1], self._work[2]  # A^T L^-1 y, A^T L^-1 1
        self.scratch, self.ucb = self._work[3], self._work[4]
        self._row = self._work[5] if self._work.shape[0] == 6 else None  # the new row, in float64 (float32)
        #: (t, c) of the acquisition values in ``ucb``, while they are valid
        self.ucb_for: tuple[int, float] | None = None

    def version(self, *, fresh_factor: bool = False) -> Partition:
        """A new version of this partition (``shared.bo.dask_gp``: Dask keeps each step's result as a value
        of its own, recomputed from the one before when a worker is lost): its own p, q, variance and
        acquisition, the same Z and ``[Z/l; ...]``, and a view of the same factor blocks (rows are only ever
        appended: this version never reads a row written after it) or, with ``fresh_factor``, new blocks
        (a rebuild rewrites every row). Only for partitions made with ``reuse_memory=False``."""
        if self.reuse_memory:
            raise ValueError("a partition whose arrays go back to the spare list has no versions")
        new = object.__new__(Partition)
        new.__dict__.update(self.__dict__)
        new._work = self._work.copy()
        new._alias()
        new.ucb_for = self.ucb_for
        if fresh_factor:
            new.ST = self.ST.copy()  # a rebuild may change the lengthscale
            new.A = FactorRows(self.n, spill="never", dtype=self.A.dtype.type, reuse=False)
        else:
            new.A = self.A.view()
        return new

    # -- state -----------------------------------------------------------------------------------------
    def reset(self, signal_variance: float, lengthscale: float | tuple[float, ...] | FloatArray) -> None:
        """The prior (t = 0) under new hyper-parameters: ``[Z/l; -|Z/l|^2/2]`` again, p = q = 0, var = s2;
        the factor's blocks are kept for the rows written next."""
        self.A.clear()
        self.ucb_for = None
        self.p.fill(0.0)
        self.q.fill(0.0)
        self.var.fill(float(signal_variance))
        ls = np.asarray(lengthscale, dtype=np.float64)
        scale = ls[:, None] if ls.ndim else ls
        Z, ST, r = self.Z, self.ST, self.Z.shape[1]

        def transpose(s: slice) -> None:  # in tiles that stay in cache (one strided pass: 3-4x slower)
            for begin in range(s.start, s.stop, TILE):
                tile = slice(begin, min(begin + TILE, s.stop))
                np.divide(Z[tile].T, scale, out=ST[:r, tile])

        split(transpose, self.n)
        self.sqnorm = np.einsum("ij,ij->j", ST[:r], ST[:r])
        np.multiply(self.sqnorm, -0.5, out=ST[r])

    @property
    def t(self) -> int:
        return self.A.t

    def row_buffer(self) -> FloatArray:
        """Where the new row is formed in float64: A's next row, or the work row beside a float32 factor."""
        return self.A.next_row() if self._row is None else self._row

    def kernel_factors(self, local: int, log_s2: float) -> tuple[FloatArray, float]:
        """(x, shift) of candidate ``local`` (this partition's numbering): ``kernel_factors``."""
        return kernel_factors(self.ST[:, local], log_s2)

    # -- one observation -------------------------------------------------------------------------------
    def update(self, msg: StepMessage) -> None:
        """The step's one chunked pass over this partition's candidates, split across the cores: on each
        chunk, the kernel row (``msg.x``'s product over the chunk and ``se_finish_log``; or, with ``msg.x``
        None, the row the caller put into ``row_buffer()``), ``g = l^T A`` over the chunk's columns (one gemv
        per block of A's rows, in the factor's precision), the new row ``a <- (k - g) inv`` (a float32 factor
        stores it rounded and reads it back), ``p += w a``, ``q += u a`` (empirical prior mean only), ``var
        -= a^2``, and with ``msg.ucb = (c, m)`` the acquisition ``mean + c std`` into ``ucb``. Then the
        factor has one row more. Below ``MIN_PARALLEL`` (one slice) the kernel row and ``l^T A`` are each one
        BLAS call over the whole range first (so BLAS keeps its threads busy), and the chunks do the rest:
        the same products and the same element-wise formula, so the same numbers."""
        if msg.t != self.A.t:
            raise ValueError(f"a step for t = {msg.t} reached a partition at t = {self.A.t}")
        a = self.row_buffer()
        if msg.x is None and msg.row is not None:  # another kernel's row, over this range (``StepMessage``)
            kind, lengthscale, z = msg.row
            a[:] = kernel_matrix(z[None, :], self.Z, kind=kind, lengthscale=lengthscale)[0]
        row = None if self._row is None else self.A.next_row()
        x = msg.lvec.astype(self.A.dtype) if msg.lvec.size else None
        dtype = self.A.dtype
        kernel = None if msg.x is None else (msg.x, msg.shift, msg.log_s2)
        whole = None
        if not in_parallel(self.n):
            if kernel is not None:
                self._kernel_row_whole(kernel, a)
                kernel = None
            if x is not None:
                whole = self.A.project(x)
        w, u, inv = msg.w, msg.u, msg.inv
        p, q, var, ST, empirical, ucb = self.p, self.q, self.var, self.ST, self.empirical, msg.ucb

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
            elif x is not None:
                g = chunk_buffer("g", dtype, size)
                self.A.project_columns(x, s, g, chunk_buffer("g_block", dtype, size))
                np.subtract(part, g, out=part)
            if row is not None:
                np.multiply(part, inv, out=row[s], casting="same_kind")  # in float64, stored rounded
                part[...] = row[s]
            else:
                np.multiply(part, inv, out=part)
            np.multiply(part, w, out=tmp)
            np.add(p[s], tmp, out=p[s])
            if empirical:
                np.multiply(part, u, out=tmp)
                np.add(q[s], tmp, out=q[s])
            np.multiply(part, part, out=tmp)
            np.subtract(var[s], tmp, out=var[s])
            if ucb is not None:
                self.ucb_slice(s, ucb[0], ucb[1], self.ucb)

        split(run, self.n, chunk=CHUNK, blas=True)
        self.A.commit()
        self.ucb_for = None if ucb is None else (self.A.t, float(ucb[0]))

    def _kernel_row_whole(self, kernel: tuple[FloatArray, float, float], out: FloatArray) -> None:
        """The kernel row over the whole range: one dgemv over ``ST``, then the clamp at ``ln s2`` (a distance
        is >= 0) and the exponential in one pass split across the cores."""
        from scipy.linalg.blas import dgemv

        x, shift, log_s2 = kernel
        dgemv(1.0, self.ST.T, x, beta=0.0, y=out, overwrite_y=1)
        split(lambda s: se_finish_log(out[s], shift, log_s2), self.n, chunk=CHUNK)

    def kernel_row(self, x: FloatArray, shift: float, log_s2: float) -> FloatArray:
        """k(z_j, Z) [n_p] from the chosen row's kernel factors."""
        out = np.empty(self.n)
        self._kernel_row_whole((x, shift, log_s2), out)
        return out

    # -- a batch rebuild -------------------------------------------------------------------------------
    def rebuild(
        self,
        Z_obs: FloatArray,
        L: FloatArray,
        w: FloatArray,
        u: FloatArray,
        signal_variance: float,
        lengthscale: float | tuple[float, ...] | FloatArray,
        round_float32: bool = False,
    ) -> None:
        """The state after t observations at ``Z_obs`` [t, r] in one batch (GPML Alg. 2.1): A = L^{-1}
        k(Z_obs, Z), p = A^T w, q = A^T u, var = s2 - sum_rows A^2; ``round_float32``: p and the variance
        follow the factor stored rounded to single precision."""
        self.reset(signal_variance, lengthscale)
        t = Z_obs.shape[0]
        if t == 0:
            return
        Kxn = se_matrix(Z_obs, self.Z, lengthscale, signal_variance)  # [t, n_p]
        A = solve_triangular(L, Kxn, lower=True, check_finite=False)
        if round_float32:
            A = A.astype(np.float32).astype(np.float64)
        self.A.load(A)
        np.matmul(A.T, w, out=self.p)
        np.matmul(A.T, u, out=self.q)
        np.einsum("ij,ij->j", A, A, out=self.var)
        np.subtract(signal_variance, self.var, out=self.var)

    # -- the acquisition ------------------------------------------------------------------------------
    def ucb_slice(self, s: slice, c: float, m: float, res: FloatArray) -> None:
        """``res[s] = mean + c sqrt(max(var, 0))`` with ``mean = p + m (1 - q)`` (p when m = 0), in the order
        of ``mean() + c * std()`` (bit for bit)."""
        part = res[s]
        np.maximum(self.var[s], 0.0, out=part)
        np.sqrt(part, out=part)
        np.multiply(part, c, out=part)
        if m:
            mean = self.scratch[s]
            np.subtract(1.0, self.q[s], out=mean)
            np.multiply(mean, m, out=mean)
            np.add(self.p[s], mean, out=mean)
            np.add(mean, part, out=part)
        else:
            np.add(self.p[s], part, out=part)

    def upper_confidence_bound(self, c: float, m: float, out: FloatArray) -> FloatArray:
        """``mean + c std`` over the partition into ``out``, in one chunked pass split across the cores."""
        split(lambda s: self.ucb_slice(s, float(c), m, out), self.n, chunk=CHUNK)
        return out

    def best(self, c: float, m: float, excluded: npt.NDArray[np.int64]) -> tuple[float, int]:
        """(value, index in this partition) of the first maximum of ``mean + c std`` among the candidates
        not in ``excluded`` (local indices), as ``np.argmax`` picks it (the first NaN if any): from the
        values the last ``update`` wrote when its c is this one, else computed now (into a new array; the
        partition is left as it was)."""
        if self.ucb_for == (self.t, float(c)):
            values = self.ucb.copy()
        else:
            values = self.upper_confidence_bound(c, m, np.empty(self.n))
        values[excluded] = -np.inf
        i = argmax(values)
        return float(values[i]), i

    def posterior_at(self, local: int, m: float) -> tuple[float, float]:
        """(mean, std) of f at candidate ``local`` of this partition."""
        i = int(local)
        mean = float(self.p[i] + m * (1.0 - self.q[i])) if m else float(self.p[i])
        return mean, math.sqrt(max(float(self.var[i]), 0.0))

    def covariance_columns(
        self, S_idx: FloatArray, sq_idx: FloatArray, A_idx: FloatArray, signal_variance: float
    ) -> FloatArray:
        """This partition's columns of ``GaussianProcess.covariance_rows`` [p, n_p] (``k(Z_p, Z) - A[:, p]^T
        A``) from the rows' columns of ``[Z/l]`` (``S_idx`` [r, p]), their squared norms ``sq_idx`` [p] and
        their columns of the factor ``A_idx`` [t, p]: the local method's operations, over this range."""
        S = self.ST[:-1]
        sq = sqdist_from_gram(sq_idx, self.sqnorm, S_idx.T @ S)
        K = se_from_sqdist(sq, signal_variance, out=sq)
        if self.t:
            K -= self.A.gram_columns(A_idx)
        return K

    def state_arrays(self) -> dict[str, Any]:
        """The partition's arrays, for tests comparing two loops."""
        return {"p": self.p, "q": self.q, "var": self.var, "t": self.t}
