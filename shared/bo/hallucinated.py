"""GP-BUCB's round on the partitions of a distributed GP: the hallucinated variance kept where the candidates
are, so that a round of B rows moves O(B (t + r + B)) numbers per partition instead of O(n B) to the driver.

``shared.bo.strategies.gp_bucb.HallucinatedVariance`` (Desautels, Krause & Burdick 2014, Alg. 1) keeps, for
one round, the variance conditioned on the pending rows [n] and their rows ``b_p = c_p / sqrt(var(z_p) +
noise)`` [B, n]. ``HallucinatedPartition`` is the same state over one partition's range, with the same
operations per candidate:

    start:   mean = p + m (1 - q) (p when m = 0);  var = max(var_t, 0);  B empty
    values:  mean + scale sqrt(max(var, 0)), -inf at the excluded rows       (``UCB.of``, ``UCB.exclude``)
    add j:   c = k_t(Z, z_j) (``Partition.covariance_columns``);  c -= B[:k, j]^T B[:k];
             b = c / sqrt(max(var_j, 0) + noise);  B[k] = b;  var -= b b

The driver (``shared.bo.dask_gp.DaskGP.hallucinated_round``) sends every partition what it needs of row j
(its columns of ``[Z/l]`` and of the factor, its column of B, the denominator), takes the first of the
partitions' first maxima, and so makes the local round's choices with the same values bit for bit.
Each add returns a new version (``version``: its own variance, the same append-only B), as the GP's steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from shared.bo.partition import Partition

FloatArray = npt.NDArray[np.float64]

__all__ = ["HallucinatedPartition"]


class HallucinatedPartition:
    """One partition's state in a GP-BUCB round (see the module docstring)."""

    def __init__(self, part: Partition, m: float, excluded: npt.NDArray[np.int64], capacity: int) -> None:
        self.part = part
        self.mean: FloatArray = part.p + m * (1.0 - part.q) if m else part.p.copy()
        self.var: FloatArray = np.maximum(part.var, 0.0)
        self.B = np.empty((max(1, int(capacity)), part.n))
        self.k = 0
        self.excluded = np.asarray(excluded, dtype=np.int64)

    def version(self) -> HallucinatedPartition:
        """A new version: its own variance and excluded rows, the same B (rows are only appended)."""
        new = object.__new__(HallucinatedPartition)
        new.__dict__.update(self.__dict__)
        new.var = self.var.copy()
        return new

    def values(self, scale: float) -> FloatArray:
        """``mean + scale std`` over the range, -inf at the excluded rows (``UCB.of`` then ``exclude``)."""
        std = np.sqrt(np.maximum(self.var, 0.0))
        out: FloatArray = self.mean + scale * std
        out[self.excluded] = -np.inf
        return out

    def best(self, scale: float) -> tuple[float, int]:
        """(value, local index) of the first maximum of ``values`` (the first NaN if any)."""
        values = self.values(scale)
        i = int(np.argmax(values))
        return float(values[i]), i

    def row(self, local: int, scale: float) -> dict[str, Any]:
        """What the driver needs of candidate ``local``: its acquisition value (``values``' entry, excluded
        or not), mean and std for the details, and for a hallucinated observation at it its variance, its
        column of B and its columns of ``[Z/l]`` and of the factor."""
        i = int(local)
        std = np.sqrt(np.maximum(self.var[i], 0.0))
        part = self.part
        return {
            "value": float(self.mean[i] + scale * std),
            "excluded": bool(np.any(self.excluded == i)),
            "mean": float(self.mean[i]),
            "std": float(std),
            "var": float(self.var[i]),
            "b": self.B[: self.k, i].copy(),
            "S": part.ST[:-1, [i]].copy(),
            "sq": part.sqnorm[[i]].copy(),
            "A": part.A.columns(np.array([i], dtype=np.int64)),
        }

    def add(
        self,
        S_idx: FloatArray,
        sq_idx: FloatArray,
        A_idx: FloatArray,
        s2: float,
        b_j: FloatArray,
        denom: float,
    ) -> None:
        """Condition on a hallucinated observation at row j (``HallucinatedVariance.add``): ``S_idx``,
        ``sq_idx``, ``A_idx`` its columns (``Partition.covariance_columns``), ``b_j`` = B[:k, j], ``denom`` =
        sqrt(max(var_j, 0) + noise)."""
        c = self.part.covariance_columns(S_idx, sq_idx, A_idx, s2)[0]
        k = self.k
        if k:
            c -= b_j @ self.B[:k]
        if k == self.B.shape[0]:
            self.B = np.vstack([self.B, np.empty_like(self.B)])
        b = c / denom
        self.B[k] = b
        self.var -= b * b
        self.k = k + 1

    def exclude(self, local: int) -> None:
        """Never choose ``local`` again in this round (a row chosen in it)."""
        self.excluded = np.append(self.excluded, np.int64(local))
