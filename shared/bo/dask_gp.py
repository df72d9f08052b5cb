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

Workers run BLAS on one thread (``shared.bo.parallel.one_blas_thread`` around every task). Dask is imported
only here and only when a ``DaskGP`` is made (the extra ``pobo[dask]``).
"""

from __future__ import annotations

import itertools
import math
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from shared.bo.gp import GaussianProcess, Hyperparameters
from shared.bo.parallel import one_blas_thread
from shared.bo.partition import Partition, StepMessage, kernel_factors, partition_bounds
from shared.errors import InputDataError

if TYPE_CHECKING:
    from distributed import Client, Future

FloatArray = npt.NDArray[np.float64]

__all__ = ["DaskGP"]


# ------------------------------------------------------------------------------- on the workers (pure)
def _make(Z: FloatArray | tuple[str, int, int], start: int, s2: float, ls: Any, empirical: bool) -> Partition:
    """The first version of a partition: its rows of Z (an array, or a .npy file's row range), the prior."""
    if isinstance(Z, tuple):
        path, begin, end = Z
        Z = np.ascontiguousarray(np.load(path, mmap_mode="r")[begin:end], dtype=np.float64)
    with one_blas_thread():
        return Partition(Z, s2, ls, start=start, empirical=empirical, spill="never", reuse_memory=False)


def _advance(part: Partition, msg: StepMessage) -> Partition:
    new = part.version()
    with one_blas_thread():
        new.update(msg)
    return new


def _rebuilt(
    part: Partition, Z_obs: FloatArray, L: FloatArray, w: FloatArray, u: FloatArray, s2: float, ls: Any
) -> Partition:
    new = part.version(fresh_factor=True)
    with one_blas_thread():
        new.rebuild(Z_obs, L, w, u, s2, ls)
    return new


def _columns(part: Partition, local: npt.NDArray[np.int64]) -> tuple[FloatArray, FloatArray]:
    """(columns of ``[Z/l; ...]`` [r + 1, p], rows of Z [p, r]) of the local indices."""
    return part.ST[:, local].copy(), part.Z[local].copy()


def _best(
    part: Partition, c: float, m: float, excluded: npt.NDArray[np.int64]
) -> tuple[float, int, FloatArray, FloatArray, tuple[float, float]]:
    """The partition's first acquisition maximum: (value, global index, its column of ``[Z/l; ...]``, its
    row of Z, its posterior (mean, std)); what the driver needs of the winner comes back with it."""
    with one_blas_thread():
        value, i = part.best(c, m, excluded)
    return value, part.start + i, part.ST[:, i].copy(), part.Z[i].copy(), part.posterior_at(i, m)


def _posterior(part: Partition, local: int, m: float) -> tuple[float, float]:
    return part.posterior_at(local, m)


def _arrays(part: Partition) -> tuple[FloatArray, FloatArray, FloatArray]:
    return part.p.copy(), part.q.copy(), part.var.copy()


# ------------------------------------------------------------------------------------ on the driver
class DaskGP(GaussianProcess):
    """``GaussianProcess`` over Z with its per-candidate state on a Dask cluster (see the module docstring).

    ``Z``: the candidates [n, r], or the path of a .npy file holding them (each partition then loads its own
    rows on its worker, and the driver reads only the rows it needs). ``partitions``: how many (default: one
    per worker); ``client``: a ``distributed.Client``. SE kernel and float64 factor only.
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
                    _make,
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
            k: self.client.submit(_columns, self._futures[k], np.array(v, dtype=np.int64), pure=False)
            for k, v in by_part.items()
        }
        for k, (cols, zrows) in zip(futures, self._gather(list(futures.values())), strict=True):
            for pos, local in enumerate(by_part[k]):
                i = self.bounds[k][0] + local
                self._cols[i], self._zrows[i] = cols[:, pos].copy(), zrows[pos].copy()

    def _kernel_factors(self, j: int) -> tuple[FloatArray, float, float] | None:
        self._fetch([j])
        log_s2 = math.log(self.hp.signal_variance)
        x, shift = kernel_factors(self._cols[int(j)], log_s2)
        return x, shift, log_s2

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
            self.client.submit(_rebuilt, f, Z_obs, L, w, u, s2, ls, key=self._key(k))
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
            futures.append(self.client.submit(_best, self._futures[k], float(c), m, mine, pure=False))
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
        future = self.client.submit(_posterior, self._futures[k], local, m, pure=False)
        mean, std = future.result()
        return float(mean), float(std)

    def _gathered(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        """p, q and the variance over all n (O(n) to the driver: for the strategies that need them whole)."""
        parts = self._gather([self.client.submit(_arrays, f, pure=False) for f in self._futures])
        return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))  # type: ignore[return-value]

    def mean(self) -> FloatArray:
        p, q, _ = self._gathered()
        m = self.m
        out: FloatArray = p + m * (1.0 - q) if m else p
        return out

    def variance(self) -> FloatArray:
        out: FloatArray = np.maximum(self._gathered()[2], 0.0)
        return out

    def std(self) -> FloatArray:
        out: FloatArray = np.sqrt(np.maximum(self._gathered()[2], 0.0))
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
        raise InputDataError(
            "covariance_rows is not available on the dask backend (gp-ucb's loop needs none)"
        )

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
        raise InputDataError("the dask backend computes the SE kernel only (another kernel is local)")

    def update(self, msg: StepMessage) -> None:
        gp = self.gp
        gp._futures = [gp.client.submit(_advance, f, msg, key=gp._key(k)) for k, f in enumerate(gp._futures)]
