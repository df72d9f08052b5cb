"""The GP loop over candidates partitioned across a Dask cluster, making the single-process loop's choices.

``DaskGP`` is a ``shared.bo.gp.GaussianProcess`` whose per-candidate state lives on the workers, one
``shared.bo.partition.Partition`` per contiguous range of rows (borders at multiples of ``ALIGN``). The
driver keeps what grows with t only: the observed rows, their columns of ``[Z/l; -|Z/l|^2/2]``, L,
L^{-1} y and L^{-1} 1 (GPML Alg. 2.1; Rasmussen & Williams 2006). A step of GP-UCB (PO-GP-UCB Alg. 2
lines 4-6, Kharkovskii et al. 2020) sends every partition one ``StepMessage`` (about 8 (t + r) bytes);
each forms its columns of the new factor row, updates its posterior and acquisition in the same pass, and
answers with its first acquisition maximum; the driver takes the first of those maxima in partition order,
which is the first maximum over all n, as ``np.argmax`` over the whole array would pick it. The numbers are
those of the single-process loop bit for bit (``shared.bo.partition``: same operations per candidate).

**Pure versions.** Each step's result is a new Dask future (``Partition.version``: its own posterior
arrays, a view of the factor's append-only blocks), computed from the previous one and the message. Dask
keeps every step's task, so when a worker dies the scheduler recomputes its partitions from the first
version (which holds its rows of Z in the task itself) along the chain of messages: the loop goes on with
the same numbers, without the driver doing anything.

**Other strategies.** With ``row_kernel`` (the heavy-tailed / LDP strategies' SE or Matern-5/2 kernel,
``shared.bo.strategies.heavy_tailed.tgp``) every partition forms its range of the chosen row's kernel row
itself (``StepMessage.row``). ``hallucinated_round`` runs a GP-BUCB round with its hallucinated variance on
the partitions (``shared.bo.hallucinated``). Both make the local loop's choices bit for bit.

Workers run BLAS on one thread (``shared.bo.parallel.one_blas_thread`` around every task). Dask is imported
only here and only when a ``DaskGP`` is made (the extra ``pobo[dask]``).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from shared.bo import dask_tasks as tasks
from shared.bo.gp import GaussianProcess, Hyperparameters
from shared.bo.kernels import RowKernel
from shared.bo.partition import StepMessage, kernel_factors, partition_bounds
from shared.errors import InputDataError

if TYPE_CHECKING:
    from distributed import Client, Future

FloatArray = npt.NDArray[np.float64]

__all__ = ["DaskGP"]


# ------------------------------------------------------------------------------------ on the driver
class DaskGP(GaussianProcess):
    """``GaussianProcess`` over Z with its per-candidate state on a Dask cluster (see the module docstring).

    ``Z``: the candidates [n, r], or the path of a .npy file holding them (each partition then loads its own
    rows on its worker, and the driver reads only the rows it needs). ``partitions``: how many (default: one
    per worker); ``client``: a ``distributed.Client``. Float64 factor only. The kernel is the SE kernel of
    ``hyperparameters`` (``shared.bo.gp``), or ``row_kernel``, a ``shared.bo.kernels.RowKernel`` (SE or
    Matern-5/2, unit variance; the heavy-tailed / LDP strategies' ``KernelGP``): each partition then forms
    its range of the chosen row's kernel row itself (``StepMessage.row``), with the same bits as the row the
    local ``KernelGP`` computes over all n (``scaled_sqdist``: each entry a function of its two rows alone);
    such a GP has no batch rebuild and no ``covariance_rows``.
    """

    def __init__(
        self,
        Z: npt.ArrayLike | str | Path,
        hyperparameters: Hyperparameters,
        *,
        client: Client,
        partitions: int | None = None,
        prior_mean: str = "zero",
        jitter: float = 1e-10,
        factor_dtype: Literal["float64", "float32"] = "float64",
        row_kernel: RowKernel | None = None,
        **_ignored: Any,
    ) -> None:
        if factor_dtype != "float64":
            raise InputDataError(
                "the dask backend keeps the factor in float64 (factor_dtype float32 is local)"
            )
        if isinstance(Z, str | Path):
            self._path: str | None = str(Z)
            source: Any = np.load(self._path, mmap_mode="r")
        else:
            self._path = None
            source = np.ascontiguousarray(Z, dtype=np.float64)
        if source.ndim != 2 or source.shape[0] < 1:
            raise InputDataError(f"Z must be a non-empty 2-D array, got shape {source.shape}")
        if prior_mean not in ("zero", "empirical"):
            raise InputDataError(f'prior_mean must be "zero" or "empirical", got {prior_mean!r}')
        self.client = client
        self.row_kernel = row_kernel
        self._pending_row: tuple[str, float, FloatArray] | None = None  # the next step's kernel row
        self.Z = source  # read by the driver only at the rows it asks for (``rows``, ``median_distance``)
        self.n = int(source.shape[0])
        self.prior_mean = prior_mean
        self.jitter = float(jitter)
        self.factor_dtype = "float64"
        self.spill, self.spill_directory = "never", None
        self.hp = hyperparameters
        parts = partitions if partitions is not None else max(1, len(client.scheduler_info()["workers"]))
        self.bounds = partition_bounds(self.n, int(parts))
        self._starts = np.array([a for a, _ in self.bounds], dtype=np.int64)
        self._tag = uuid.uuid4().hex[:12]
        self._version = itertools.count()
        self._futures: list[Future[Any]] = []
        for k, (a, b) in enumerate(self.bounds):
            if not np.isfinite(source[a:b]).all():
                raise InputDataError("Z must be finite")
            rows: Any = (self._path, a, b) if self._path is not None else np.array(source[a:b])
            self._futures.append(
                client.submit(
                    tasks.make,
                    rows,
                    a,
                    float(self.hp.signal_variance),
                    self.hp.lengthscale,
                    prior_mean == "empirical",
                    key=self._key(k),
                )
            )
        self._cols: dict[
            int, FloatArray
        ] = {}  # row -> its column of [Z/l; ...] (under the current lengthscale)
        self._zrows: dict[int, FloatArray] = {}  # row -> its row of Z
        self._reset()

    def _gather(self, futures: list[Future[Any]]) -> list[Any]:
        out: list[Any] = self.client.gather(futures)  # type: ignore[no-untyped-call]
        return out

    def _key(self, k: int) -> str:
        return f"pobo-gp-{self._tag}-{k}-{next(self._version)}"

    # -- the driver's O(t^2) state ------------------------------------------------------------------
    def _reset(self) -> None:
        cap = 16
        self._idx = np.empty(cap, dtype=np.int64)
        self._y = np.empty(cap)
        self._L = np.zeros((cap, cap))
        self._w = np.empty(cap)
        self._u = np.empty(cap)
        self._err = np.zeros(cap)
        self.t = 0
        self._row = None
        self._ucb_for = None
        self._posterior: tuple[int, int, float, tuple[float, float]] | None = None
        self._cols.clear()  # the columns of [Z/l; ...] change with the lengthscale

    def _locate(self, index: int) -> tuple[int, int]:
        """(partition, local index) of a candidate."""
        k = int(np.searchsorted(self._starts, index, side="right")) - 1
        return k, int(index) - self.bounds[k][0]

    def _fetch(self, indices: npt.ArrayLike) -> None:
        """Bring the columns of ``[Z/l; ...]`` and the rows of Z of ``indices`` to the driver."""
        missing = sorted({int(i) for i in np.atleast_1d(indices)} - self._cols.keys())
        by_part: dict[int, list[int]] = {}
        for i in missing:
            k, local = self._locate(i)
            by_part.setdefault(k, []).append(local)
        futures = {
            k: self.client.submit(tasks.columns, self._futures[k], np.array(v, dtype=np.int64), pure=False)
            for k, v in by_part.items()
        }
        for k, (cols, zrows) in zip(futures, self._gather(list(futures.values())), strict=True):
            for pos, local in enumerate(by_part[k]):
                i = self.bounds[k][0] + local
                self._cols[i], self._zrows[i] = cols[:, pos].copy(), zrows[pos].copy()

    def _kernel_factors(self, j: int) -> tuple[FloatArray, float, float] | None:
        if self.row_kernel is not None:
            return None  # ``_other_kernel_row``
        self._fetch([j])
        log_s2 = math.log(self.hp.signal_variance)
        x, shift = kernel_factors(self._cols[int(j)], log_s2)
        return x, shift, log_s2

    def _other_kernel_row(self, j: int, idx: npt.NDArray[np.int64]) -> FloatArray:
        """``k(Z_I, Z_j)`` [t] on the driver (``RowKernel.block``: entry by entry the bits of the local
        ``KernelGP``'s row at I); the partitions form their ranges of the row from the message's
        ``(kind, lengthscale, z_j)`` (``_Broadcast.update``)."""
        kernel = self.row_kernel
        if kernel is None:
            raise InputDataError("the SE kernel's row comes from its factors (``_kernel_factors``)")
        self._pending_row = (kernel.kind, kernel.lengthscale, np.array(kernel.Z[int(j)], dtype=np.float64))
        out: FloatArray = kernel.block([int(j)], idx)[0]
        return out

    def _st_columns(self, idx: npt.NDArray[np.int64]) -> FloatArray:
        self._fetch(idx)
        r1 = self.Z.shape[1] + 1
        out = np.empty((r1, idx.size), order="F")  # the layout of ``ST[:, idx]`` (the product's BLAS call)
        for pos, i in enumerate(idx.tolist()):
            out[:, pos] = self._cols[i]
        return out

    def rows(self, indices: npt.ArrayLike) -> FloatArray:
        idx = np.atleast_1d(np.asarray(indices, dtype=np.int64))
        self._fetch([i for i in idx.tolist() if i not in self._zrows])
        out = np.empty((idx.size, self.Z.shape[1]))
        for pos, i in enumerate(idx.tolist()):
            out[pos] = self._zrows[i]
        return out

    # -- steps (``GaussianProcess.add``: the driver's part there, the partitions' as a new version each) ----
    @property
    def _part(self) -> _Broadcast:  # type: ignore[override]
        return _Broadcast(self)

    def _rebuild(self, idx: npt.NDArray[np.int64], y: FloatArray) -> None:
        """``GaussianProcess._rebuild``: L, L^{-1} y and L^{-1} 1 here, every partition rebuilt as a new
        version (t = 0: back to the prior under the current hyper-parameters)."""
        t = idx.size
        if t and self.row_kernel is not None:
            raise InputDataError("a GP with a row kernel grows one observation at a time (no batch rebuild)")
        self._cols.clear()  # the lengthscale changed: the columns of [Z/l; ...] with it
        while self._idx.size < t:
            self._grow()
        Z_obs = self.rows(idx)  # kept by the driver across the refit (the columns are fetched again)
        if t:
            L, w, u = self._batch_factor(Z_obs, y)
            self._L[:t, :t], self._w[:t], self._u[:t] = L, w, u
        else:
            L, w, u = np.empty((0, 0)), np.empty(0), np.empty(0)
        s2, ls = float(self.hp.signal_variance), self.hp.lengthscale
        self._futures = [
            self.client.submit(tasks.rebuilt, f, Z_obs, L, w, u, s2, ls, key=self._key(k))
            for k, f in enumerate(self._futures)
        ]
        self._idx[:t], self._y[:t] = idx, y
        self.t = t

    # -- reading the posterior -------------------------------------------------------------------------
    def ucb_argmax(self, c: float, excluded: npt.NDArray[np.int64]) -> tuple[int, float]:
        """Every partition's first maximum (its excluded rows at -inf), then the first of them in
        partition order (ties: the smallest index; a NaN first), as ``np.argmax`` over all n. One round
        trip: the winner's column, row and posterior come with it (``posterior_at`` and the next ``add``
        need nothing more from the cluster)."""
        excluded = np.asarray(excluded, dtype=np.int64)
        m = self.m
        futures = []
        for k, (a, b) in enumerate(self.bounds):
            mine = excluded[(excluded >= a) & (excluded < b)] - a
            futures.append(self.client.submit(tasks.best, self._futures[k], float(c), m, mine, pure=False))
        found = self._gather(futures)
        k = int(np.argmax(np.array([v[0] for v in found])))
        value, index, column, zrow, posterior = found[k]
        self._cols[index], self._zrows[index] = column, zrow
        self._posterior = (index, self.t, m, posterior)
        return int(index), float(value)

    def posterior_at(self, index: int) -> tuple[float, float]:
        index, m = int(index), self.m
        if self._posterior is not None and self._posterior[:3] == (index, self.t, m):
            return self._posterior[3]
        k, local = self._locate(index)
        future = self.client.submit(tasks.posterior, self._futures[k], local, m, pure=False)
        mean, std = future.result()
        return float(mean), float(std)

    def _gathered(self, names: tuple[str, ...] = ("p", "q", "var")) -> tuple[FloatArray, ...]:
        """The partitions' arrays ``names`` (of p, q, var) over all n (O(n) each to the driver: for the
        strategies that need them whole)."""
        futures = [self.client.submit(tasks.arrays, f, names, pure=False) for f in self._futures]
        parts = self._gather(futures)
        return tuple(np.concatenate([p[i] for p in parts]) for i in range(len(names)))

    def mean(self) -> FloatArray:
        m = self.m
        if not m:
            return self._gathered(("p",))[0]
        p, q = self._gathered(("p", "q"))
        out: FloatArray = p + m * (1.0 - q)
        return out

    def variance(self) -> FloatArray:
        out: FloatArray = np.maximum(self._gathered(("var",))[0], 0.0)
        return out

    def variance_at(self, index: int) -> float:
        k, local = self._locate(int(index))
        var = self.client.submit(tasks.variance, self._futures[k], local, pure=False).result()
        return float(np.maximum(var, 0.0))

    def std(self) -> FloatArray:
        out: FloatArray = np.sqrt(np.maximum(self._gathered(("var",))[0], 0.0))
        return out

    def upper_confidence_bound(self, c: float, out: FloatArray | None = None) -> FloatArray:
        p, q, var = self._gathered()
        m, c = self.m, float(c)
        res: FloatArray = np.empty(self.n) if out is None else out
        np.maximum(var, 0.0, out=res)
        np.sqrt(res, out=res)
        np.multiply(res, c, out=res)
        res += p + m * (1.0 - q) if m else p
        return res

    def ucb_values(self, c: float) -> FloatArray:
        return self.upper_confidence_bound(c)

    def covariance_rows(self, indices: npt.ArrayLike) -> FloatArray:
        """``GaussianProcess.covariance_rows`` [p, n], gathered: the rows' columns of ``[Z/l]``, their
        squared norms and their columns of the factor (O(p (t + r))) go from their partitions to every
        partition, each computes its columns with the local method's operations
        (``Partition.covariance_columns``), and the p x n result comes back to the driver."""
        if self.row_kernel is not None:
            raise InputDataError("covariance_rows needs the SE kernel on the dask backend")
        idx = np.atleast_1d(np.asarray(indices, dtype=np.int64))
        if idx.size and not (0 <= int(idx.min()) and int(idx.max()) < self.n):
            raise InputDataError(f"indices must be in [0, {self.n - 1}]")
        by_part: dict[int, list[tuple[int, int]]] = {}  # partition -> [(position in idx, local index)]
        for pos, i in enumerate(idx.tolist()):
            k, local = self._locate(i)
            by_part.setdefault(k, []).append((pos, local))
        futures = [
            self.client.submit(
                tasks.covariance_inputs,
                self._futures[k],
                np.array([lc for _, lc in v], dtype=np.int64),
                pure=False,
            )
            for k, v in by_part.items()
        ]
        r = self.Z.shape[1]
        S_idx, sq_idx, A_idx = np.empty((r, idx.size)), np.empty(idx.size), np.empty((self.t, idx.size))
        for v, (S, sq, A) in zip(by_part.values(), self._gather(futures), strict=True):
            positions = [pos for pos, _ in v]
            S_idx[:, positions], sq_idx[positions], A_idx[:, positions] = S, sq, A
        s2 = float(self.hp.signal_variance)
        parts = self._gather(
            [
                self.client.submit(tasks.covariance, f, S_idx, sq_idx, A_idx, s2, pure=False)
                for f in self._futures
            ]
        )
        out: FloatArray = np.concatenate(parts, axis=1)
        return out

    def hallucinated_round(self, excluded: npt.NDArray[np.bool_], capacity: int) -> HallucinatedRound:
        """A GP-BUCB round on the partitions (``shared.bo.hallucinated``): ``excluded`` [n] the rows never
        chosen in it, ``capacity`` the rows it may hallucinate."""
        return HallucinatedRound(self, excluded, capacity)

    def close(self) -> None:
        """Release the partitions' futures (the cluster forgets them)."""
        for f in self._futures:
            f.release()  # type: ignore[no-untyped-call]
        self._futures = []


class _Broadcast:
    """What ``GaussianProcess.add`` calls on its partition, sent to every partition as a new version."""

    def __init__(self, gp: DaskGP) -> None:
        self.gp = gp

    def row_buffer(self) -> FloatArray:
        raise InputDataError("on the dask backend the partitions form another kernel's row themselves")

    def update(self, msg: StepMessage) -> None:
        gp = self.gp
        if msg.x is None:  # another kernel: the row the partitions form (``DaskGP._other_kernel_row``)
            if gp._pending_row is None:
                raise InputDataError("a step without the SE kernel's factors needs the row kernel's row")
            msg, gp._pending_row = dataclasses.replace(msg, row=gp._pending_row), None
        gp._futures = [
            gp.client.submit(tasks.advance, f, msg, key=gp._key(k)) for k, f in enumerate(gp._futures)
        ]


class HallucinatedRound:
    """GP-BUCB's round (``shared.bo.strategies.gp_bucb``) with its hallucinated variance on the partitions
    (``shared.bo.hallucinated.HallucinatedPartition``): the choices and values of the local
    ``HallucinatedVariance`` over the gathered arrays, bit for bit, moving O(t + r + B) numbers per partition
    and hallucinated row instead of the n-vectors."""

    def __init__(self, gp: DaskGP, excluded: npt.NDArray[np.bool_], capacity: int) -> None:
        if gp.row_kernel is not None:
            raise InputDataError("a hallucinated round needs the SE kernel on the dask backend")
        self.gp = gp
        self.noise = float(gp.hp.noise_variance + gp.jitter)  # as ``HallucinatedVariance``
        m = gp.m
        self._futures = []
        for k, (a, b) in enumerate(gp.bounds):
            mine = np.flatnonzero(excluded[a:b]).astype(np.int64)
            self._futures.append(
                gp.client.submit(tasks.round_start, gp._futures[k], m, mine, int(capacity), key=gp._key(k))
            )
        self._rows: dict[int, dict[str, Any]] = {}  # global index -> ``HallucinatedPartition.row`` (this k)

    def best(self, scale: float) -> tuple[int, float]:
        """(index, value) of the first maximum of ``mean + scale std`` over the rows not excluded."""
        client = self.gp.client
        found = self.gp._gather(
            [client.submit(tasks.round_best, f, float(scale), pure=False) for f in self._futures]
        )
        k = int(np.argmax(np.array([v[0] for v in found])))
        value, index, row = found[k]
        self._rows = {int(index): row}
        return int(index), float(value)

    def row(self, index: int, scale: float) -> dict[str, Any]:
        """``HallucinatedPartition.row`` of ``index``: value, excluded, mean, std, var and its columns."""
        index = int(index)
        if index not in self._rows:
            k, local = self.gp._locate(index)
            future = self.gp.client.submit(tasks.round_row, self._futures[k], local, float(scale), pure=False)
            self._rows = {index: future.result()}
        return self._rows[index]

    def add(self, index: int, scale: float) -> None:
        """A hallucinated observation at ``index`` (``HallucinatedVariance.add``), excluded from now on."""
        gp, index = self.gp, int(index)
        row = self.row(index, scale)
        denom = math.sqrt(max(row["var"], 0.0) + self.noise)
        owner, local = gp._locate(index)
        s2 = float(gp.hp.signal_variance)
        self._futures = [
            gp.client.submit(
                tasks.round_add,
                f,
                row["S"],
                row["sq"],
                row["A"],
                s2,
                row["b"],
                denom,
                local if k == owner else None,
                key=gp._key(k),
            )
            for k, f in enumerate(self._futures)
        ]
        self._rows = {}
