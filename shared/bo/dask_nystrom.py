"""The Nystrom strategies' approximate posterior over candidates partitioned across a Dask cluster.

``ata-gp-ucb``, ``moma-gp-ucb`` and their LDP variants (``shared.bo.strategies.heavy_tailed``) recompute,
after every round (MoMA: epoch), the approximate posterior at all n from a new dictionary of m atoms::

    k_D = k(Z_D, Z) [m, n];  mu~ = (W^T theta)^T k_D;  sigma~^2 = max(1 - k_D^T M k_D, 0)

with W^T theta [m] and M [m, m] (``shared.bo.nystrom.posterior_factors``) formed by the driver from the
O(t m^2) state it keeps (dictionary, V~, truncated or median-of-means estimate). On the dask backend
(``shared.bo.backend.set_dask_backend``) ``NystromPosterior`` sends them, with the atoms' rows of Z, to every
partition: a contiguous range of candidates (borders at multiples of 64, ``shared.bo.partition
.partition_bounds``) whose rows of Z a task loaded once per strategy. Each partition forms its columns of
k_D (``kernel_matrix``: each entry a function of its two rows alone) and its range of mu~ and sigma~^2 with
``posterior_from_block``, the function the local strategy applies to all n, BLAS on one thread. Then
``RemoteUCB`` asks each partition for its first maximum of ``mu~ + beta sigma~`` (excluded rows at -inf) and
takes the first of those in partition order, as ``np.argmax`` over all n would: the choices and the request
details (acquisition, mean, std) are the local strategy's bit for bit when the local one runs BLAS on one
thread (a threaded BLAS may change the last bits of ``M @ k_D`` locally; ``posterior_from_block``).

No n-vector comes to the driver: a round moves O(m^2 + m r) numbers to each partition and a few back; the
variance at the played rows (the next dictionary's sampling weights, Alg. 4) and the mean at a row
(``posterior_mean``) are read from their partitions. A strategy rebuilt from its history evaluates the
posterior only at the played rows until its last update (``replay``): those columns are computed on the
driver as by the local strategy (``set_columns``), the last update on the partitions.

Each update's results are new futures computed from the partition's rows and the broadcast factors, so
Dask recomputes a lost partition by itself.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from shared.bo.acquisition import ucb_details, ucb_scores
from shared.bo.kernels import RowKernel, kernel_matrix
from shared.bo.nystrom import NystromEmbedding, posterior_factors, posterior_from_block
from shared.bo.parallel import one_blas_thread
from shared.bo.partition import partition_bounds
from shared.errors import StrategyError

if TYPE_CHECKING:
    from distributed import Client, Future

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Posterior = tuple[FloatArray, FloatArray]  # (mean, var) of a partition's range

__all__ = ["NystromPosterior", "RemoteUCB", "nystrom_posterior"]


# ---------------------------------------------------------------------------------- tasks (on the workers)
def load_rows(rows: FloatArray | tuple[str, int, int]) -> FloatArray:
    """A partition's rows of Z: the array, or a .npy file's row range ``(path, begin, end)``."""
    if isinstance(rows, tuple):
        path, begin, end = rows
        return np.ascontiguousarray(np.load(path, mmap_mode="r")[begin:end], dtype=np.float64)
    return rows


def prior(rows: FloatArray) -> Posterior:
    """mu~ = 0, sigma~^2 = 1 (no dictionary), as ``approximate_posterior``."""
    c = int(rows.shape[0])
    return np.zeros(c), np.ones(c)


def posterior(
    rows: FloatArray, Z_atoms: FloatArray, kind: str, lengthscale: float, w_theta: FloatArray, M: FloatArray
) -> Posterior:
    """The partition's range of mu~ and sigma~^2 (``posterior_from_block`` on its columns of k_D)."""
    with one_blas_thread():
        k_D = kernel_matrix(Z_atoms, rows, kind=kind, lengthscale=lengthscale)
        return posterior_from_block(k_D, w_theta, M)


def best(
    post: Posterior, start: int, scale: float, capped: IntArray, unavailable: IntArray
) -> tuple[float, int, float, float, bool]:
    """(value, global index, mean, std) of the first maximum of ``mean + scale std`` with the ``capped`` and
    ``unavailable`` rows (local indices) at -inf, and whether a value is finite once the capped are out."""
    mean, var = post
    std = np.sqrt(var)
    values = ucb_scores(mean, std, scale)
    values[capped] = -np.inf
    finite = bool(np.isfinite(values).any())
    values[unavailable] = -np.inf
    i = int(np.argmax(values))
    return float(values[i]), start + i, float(mean[i]), float(std[i]), finite


def values_at(post: Posterior, local: IntArray, scale: float) -> tuple[FloatArray, FloatArray, FloatArray]:
    """(mean + scale std, mean, var) at the local indices."""
    mean, var = post[0][local], post[1][local]
    std = np.sqrt(var)
    return ucb_scores(mean, std, scale), mean, var


# ---------------------------------------------------------------------------------------- on the driver
def nystrom_posterior(Z: FloatArray, kernel: RowKernel) -> NystromPosterior | None:
    """A ``NystromPosterior`` over Z when the process's backend is dask, else None (the strategy keeps its
    posterior in this process)."""
    from shared.bo import backend

    setting = backend._dask  # (client, partitions, workers read this process's files) or None
    if setting is None:
        return None
    client, partitions, reads = setting
    path = backend.npy_file(Z) if reads else None
    return NystromPosterior(Z, kernel, client=client, partitions=partitions, path=path)


class NystromPosterior:
    """mu~ and sigma~^2 of a Nystrom strategy, each partition's range on the cluster (module docstring)."""

    def __init__(
        self,
        Z: FloatArray,
        kernel: RowKernel,
        *,
        client: Client,
        partitions: int | None = None,
        path: str | None = None,
    ) -> None:
        self.client = client
        self.kernel = kernel
        self.Z = Z  # the driver reads the atoms' rows only
        self.n = int(Z.shape[0])
        parts = partitions if partitions is not None else max(1, len(client.scheduler_info()["workers"]))
        self.bounds = partition_bounds(self.n, int(parts))
        self._starts = np.array([a for a, _ in self.bounds], dtype=np.int64)
        self._tag = uuid.uuid4().hex[:12]
        self._count = 0
        self._rows: list[Future[Any]] = [
            client.submit(load_rows, (path, a, b) if path else np.array(Z[a:b]), key=self._key("rows", k))
            for k, (a, b) in enumerate(self.bounds)
        ]
        self._post: list[Future[Any]] = []
        self._columns: dict[int, tuple[float, float]] | None = None  # driver-side (mean, var) by row
        self._unavailable: tuple[Any, list[IntArray]] = (None, [])
        self.set_prior()

    def _key(self, what: str, k: int) -> str:
        self._count += 1
        return f"pobo-nystrom-{what}-{self._tag}-{k}-{self._count}"

    def _gather(self, futures: Sequence[Future[Any]]) -> list[Any]:
        out: list[Any] = self.client.gather(list(futures))  # type: ignore[no-untyped-call]
        return out

    def _locate(self, indices: IntArray) -> dict[int, tuple[IntArray, IntArray]]:
        """partition -> (positions in ``indices``, local indices) of the candidates ``indices``."""
        parts = np.searchsorted(self._starts, indices, side="right") - 1
        out = {}
        for k in np.unique(parts).tolist():
            pos = np.flatnonzero(parts == k)
            out[int(k)] = (pos, indices[pos] - self.bounds[k][0])
        return out

    # -- the posterior's versions ----------------------------------------------------------------------
    def set_prior(self) -> None:
        self._columns = None
        self._post = [
            self.client.submit(prior, r, key=self._key("prior", k)) for k, r in enumerate(self._rows)
        ]

    def update(
        self, emb: NystromEmbedding | None, theta: FloatArray, root_inv: FloatArray, lam: float
    ) -> None:
        """``approximate_posterior(kernel, emb, theta, root_inv, lam, None)`` on the partitions."""
        if emb is None or emb.m == 0:
            self.set_prior()
            return
        w_theta, M = posterior_factors(emb, theta, root_inv, lam)
        Z_atoms = np.ascontiguousarray(self.Z[emb.atoms])
        kind, ls = self.kernel.kind, float(self.kernel.lengthscale)
        self._columns = None
        self._post = [
            self.client.submit(posterior, r, Z_atoms, kind, ls, w_theta, M, key=self._key("post", k))
            for k, r in enumerate(self._rows)
        ]

    def set_columns(self, cols: IntArray, mean: FloatArray, var: FloatArray) -> None:
        """The posterior computed by the driver at ``cols`` only (a replay's update before the last)."""
        known = dict(self._columns or {})
        known.update(zip(cols.tolist(), zip(mean.tolist(), var.tolist(), strict=True), strict=True))
        self._columns = known

    # -- reading it ----------------------------------------------------------------------------------
    def at(self, indices: npt.ArrayLike, scale: float = 0.0) -> tuple[FloatArray, FloatArray, FloatArray]:
        """(mean + scale std, mean, var) at ``indices``, from their partitions."""
        idx = np.atleast_1d(np.asarray(indices, dtype=np.int64))
        values, mean, var = np.empty(idx.size), np.empty(idx.size), np.empty(idx.size)
        if self._columns is not None:
            for pos, i in enumerate(idx.tolist()):
                mean[pos], var[pos] = self._columns.get(i, (np.nan, np.nan))
            values[:] = ucb_scores(mean, np.sqrt(var), scale)
            return values, mean, var
        where = self._locate(idx)
        futures = [
            self.client.submit(values_at, self._post[k], local, float(scale), pure=False)
            for k, (_, local) in where.items()
        ]
        for (at, _local), (v, mu, s2) in zip(where.values(), self._gather(futures), strict=True):
            values[at], mean[at], var[at] = v, mu, s2
        return values, mean, var

    def var_at(self, rows: IntArray) -> FloatArray:
        return self.at(rows)[2]

    def mean_at(self, index: int) -> float:
        return float(self.at([int(index)])[1][0])

    def unavailable_parts(self, unavailable: npt.NDArray[np.bool_] | None) -> list[IntArray]:
        """The local indices of the unavailable rows of each partition (kept while the mask is the same)."""
        if unavailable is None:
            return [np.zeros(0, dtype=np.int64) for _ in self.bounds]
        if self._unavailable[0] is not unavailable:
            parts = [np.flatnonzero(unavailable[a:b]).astype(np.int64) for a, b in self.bounds]
            self._unavailable = (unavailable, parts)
        return self._unavailable[1]

    def ucb(self, beta: float, *, scale: float, unavailable: npt.NDArray[np.bool_] | None) -> RemoteUCB:
        return RemoteUCB(self, beta, scale, unavailable)


class RemoteUCB:
    """``shared.bo.acquisition.UCB`` over a ``NystromPosterior``: the same ``exclude`` / ``choose`` /
    ``details`` (``unavailable`` is given up front, so one round trip answers both ``any_finite`` and the
    argmax)."""

    def __init__(
        self, post: NystromPosterior, beta: float, scale: float, unavailable: npt.NDArray[np.bool_] | None
    ) -> None:
        self.post, self.beta, self.scale = post, float(beta), float(scale)
        self.unavailable = unavailable
        self.capped = np.zeros(0, dtype=np.int64)
        self._found: list[tuple[float, int, float, float, bool]] | None = None
        self._rows: dict[int, tuple[float, float, float]] = {}  # index -> (value, mean, std)

    def exclude(self, rows: npt.NDArray[np.bool_] | IntArray) -> None:
        given = np.asarray(rows)
        idx = np.flatnonzero(given) if given.dtype == bool else given.astype(np.int64)
        self.capped = np.union1d(self.capped, idx).astype(np.int64)
        self._found = None

    def _best(self) -> list[tuple[float, int, float, float, bool]]:
        if self._found is None:
            post = self.post
            unavailable = post.unavailable_parts(self.unavailable)
            futures = []
            for k, (a, b) in enumerate(post.bounds):
                capped = self.capped[(self.capped >= a) & (self.capped < b)] - a
                args = (post._post[k], a, self.scale, capped, unavailable[k])
                futures.append(post.client.submit(best, *args, pure=False))
            self._found = post._gather(futures)
        return self._found

    def any_finite(self) -> bool:
        """Whether a score is finite once the ``exclude``d rows are out (``unavailable`` still counts)."""
        return any(f[4] for f in self._best())

    def choose(
        self,
        initial: Sequence[int],
        play: int,
        source: str,
        *,
        unavailable: npt.NDArray[np.bool_] | None = None,
    ) -> tuple[int, str]:
        """``UCB.choose``: the initial row of the play while there is one, else the first argmax."""
        if play < len(initial) and (unavailable is None or not unavailable[int(initial[play])]):
            index = int(initial[play])
            values, means, var = self.post.at([index], self.scale)
            value = -np.inf if index in set(self.capped.tolist()) else float(values[0])
            self._rows[index] = (value, float(means[0]), float(np.sqrt(var)[0]))
            return index, "initial"
        found = self._best()
        k = int(np.argmax(np.array([f[0] for f in found])))
        value, index, mean, std, _ = found[k]
        self._rows[index] = (value, mean, std)
        if unavailable is not None and not np.isfinite(value):
            raise StrategyError(
                f"no row is left to choose: all {self.post.n} are excluded (queried already, or their "
                "person cannot afford another answer under the study's grant)"
            )
        return index, source

    def details(self, index: int, *, source: str, **extra: Any) -> dict[str, Any]:
        """``UCB.details`` of the chosen row: its score, beta, mean and std, then ``extra``."""
        value, mean, std = self._rows[int(index)]
        return ucb_details(source=source, acquisition=value, beta=self.beta, mean=mean, std=std, **extra)
