"""Random Fourier features of the squared-exponential kernel, shared by every agent of a federation.

Paper: DP-FTS-DE (Dai, Low & Jaillet, NeurIPS 2021), Section 2 ("Random Fourier features ... k(x, x') ~
phi(x)^T phi(x')"; all agents share the same features), after Rahimi & Recht 2008. The coordinator draws
the frequencies and phases once and publishes them; every agent computes the same phi.

Notation (shapes in brackets)::

    d                 input dimension;  M  number of features
    ell   [d]         lengthscale(s) of the SE kernel;  s2  its signal variance
    k(x, x')          s2 exp(-||(x - x') / ell||^2 / 2)          (the SE kernel, ``shared.bo.kernels``)
    W     [M, d]      frequencies, W[m, j] = g[m, j] / ell[j], g ~ N(0, 1)   (the kernel's spectral density)
    b     [M]         phases, b ~ U(0, 2 pi)
    phi(x) [M]        sqrt(2 s2 / M) cos(W x + b)
    E[phi(x)^T phi(x')] = k(x, x')  and the error is O(M^{-1/2})   (Rahimi & Recht 2008, Claim 1)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shared.bo.kernels import se_matrix
from shared.errors import InputDataError

FloatArray = npt.NDArray[np.float64]

__all__ = ["RFF_KIND", "RandomFourierFeatures", "draw_rff", "se_kernel"]

RFF_KIND = "rff-se"
MAX_FEATURES = 100_000


def _positive(name: str, value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise InputDataError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def _count(name: str, value: int, *, upper: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or not 1 <= value <= upper:
        raise InputDataError(f"{name} must be an integer in [1, {upper}], got {value!r}")
    return int(value)


def _lengthscales(lengthscale: float | npt.ArrayLike, d: int) -> FloatArray:
    ell = np.asarray(lengthscale, dtype=np.float64)
    if ell.ndim == 0:
        ell = np.full(d, float(ell))
    if ell.shape != (d,):
        raise InputDataError(f"lengthscale must be a number or have shape ({d},), got shape {ell.shape}")
    if not (np.isfinite(ell).all() and (ell > 0).all()):
        raise InputDataError("lengthscale must be finite and > 0")
    return ell


def se_kernel(
    X: npt.ArrayLike, X2: npt.ArrayLike, lengthscale: float | npt.ArrayLike, signal_variance: float = 1.0
) -> FloatArray:
    """The exact SE kernel matrix k(X, X2) = s2 exp(-||(x - x') / ell||^2 / 2), shape [k, k2]
    (``shared.bo.kernels.se_matrix``)."""
    A = np.atleast_2d(np.asarray(X, dtype=np.float64))
    B = np.atleast_2d(np.asarray(X2, dtype=np.float64))
    return se_matrix(A, B, _lengthscales(lengthscale, A.shape[1]), float(signal_variance))


@dataclass(frozen=True)
class RandomFourierFeatures:
    """phi(x) = sqrt(2 s2 / M) cos(W x + b): the published feature map of one federation.

    ``W`` [M, d] already includes the division by the lengthscale, so an agent needs only ``W``, ``b`` and
    ``signal_variance``; ``lengthscale`` is kept for information (and for the exact kernel in tests).
    """

    W: FloatArray  # [M, d]
    b: FloatArray  # [M]
    lengthscale: FloatArray  # [d]
    signal_variance: float

    def __post_init__(self) -> None:
        W = np.asarray(self.W, dtype=np.float64)
        b = np.asarray(self.b, dtype=np.float64)
        if W.ndim != 2 or W.shape[0] < 1 or W.shape[1] < 1:
            raise InputDataError(f"frequencies must have shape [M, d] with M, d >= 1, got shape {W.shape}")
        if b.shape != (W.shape[0],):
            raise InputDataError(f"phases must have shape ({W.shape[0]},), got shape {b.shape}")
        if not (np.isfinite(W).all() and np.isfinite(b).all()):
            raise InputDataError("frequencies and phases must be finite")
        ell = _lengthscales(self.lengthscale, W.shape[1])
        object.__setattr__(self, "W", W)
        object.__setattr__(self, "b", b)
        object.__setattr__(self, "lengthscale", ell)
        object.__setattr__(self, "signal_variance", _positive("signal_variance", self.signal_variance))

    @property
    def M(self) -> int:
        """Number of features."""
        return int(self.W.shape[0])

    @property
    def d(self) -> int:
        """Input dimension."""
        return int(self.W.shape[1])

    def _points(self, X: npt.ArrayLike) -> FloatArray:
        A = np.asarray(X, dtype=np.float64)
        if A.ndim == 1 and A.shape == (self.d,):
            A = A[None, :]
        if A.ndim != 2 or A.shape[1] != self.d:
            raise InputDataError(f"X must have shape [k, {self.d}], got shape {A.shape}")
        if not np.isfinite(A).all():
            raise InputDataError("X must be finite")
        return A

    def features(self, X: npt.ArrayLike) -> FloatArray:
        """phi(X) [k, M] = sqrt(2 s2 / M) cos(X W^T + b) (Section 2 of the paper; Rahimi & Recht 2008)."""
        A = self._points(X)
        return math.sqrt(2.0 * self.signal_variance / self.M) * np.cos(A @ self.W.T + self.b)

    def value_and_grad(self, x: npt.ArrayLike, omega: npt.ArrayLike) -> tuple[float, FloatArray]:
        """f(x) = phi(x)^T omega and its gradient -sqrt(2 s2 / M) W^T (sin(W x + b) * omega), shape [d].

        Used by the L-BFGS-B refinement of the argmax of Algorithm 2, lines 6 and 8.
        """
        xv = np.asarray(x, dtype=np.float64).reshape(self.d)
        w = np.asarray(omega, dtype=np.float64).reshape(self.M)
        arg = self.W @ xv + self.b
        c = math.sqrt(2.0 * self.signal_variance / self.M)
        return float(c * np.cos(arg) @ w), -c * (self.W.T @ (np.sin(arg) * w))

    def to_public(self) -> dict[str, Any]:
        """A JSON-serialisable description every agent can rebuild the feature map from."""
        return {
            "kind": RFF_KIND,
            "d": self.d,
            "M": self.M,
            "lengthscale": [float(v) for v in self.lengthscale],
            "signal_variance": float(self.signal_variance),
            "frequencies": self.W.tolist(),
            "phases": self.b.tolist(),
        }

    @classmethod
    def from_public(cls, data: dict[str, Any]) -> RandomFourierFeatures:
        """Inverse of :meth:`to_public`; checks kind, shapes and finiteness (InputDataError otherwise)."""
        if not isinstance(data, dict) or data.get("kind") != RFF_KIND:
            raise InputDataError(f"expected a published feature map of kind {RFF_KIND!r}")
        try:
            W = np.asarray(data["frequencies"], dtype=np.float64)
            b = np.asarray(data["phases"], dtype=np.float64)
            ell = np.asarray(data["lengthscale"], dtype=np.float64)
            s2 = float(data["signal_variance"])
            d, M = int(data["d"]), int(data["M"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InputDataError(f"malformed published feature map: {exc}") from None
        if W.shape != (M, d):
            raise InputDataError(f"frequencies must have shape ({M}, {d}), got shape {W.shape}")
        return cls(W=W, b=b, lengthscale=ell, signal_variance=s2)


def draw_rff(
    d: int,
    M: int,
    lengthscale: float | npt.ArrayLike,
    signal_variance: float = 1.0,
    *,
    rng: np.random.Generator,
) -> RandomFourierFeatures:
    """Draw the shared features once (the coordinator, at federation creation).

    W = G / ell with G [M, d] ~ N(0, 1) (the spectral density of the SE kernel is N(0, diag(ell)^-2)) and
    b ~ U(0, 2 pi) [M] (Rahimi & Recht 2008, Algorithm 1; the paper's Section 2).
    """
    d = _count("d", d, upper=10_000)
    M = _count("M", M, upper=MAX_FEATURES)
    ell = _lengthscales(lengthscale, d)
    s2 = _positive("signal_variance", signal_variance)
    W = rng.standard_normal((M, d)) / ell
    b = rng.uniform(0.0, 2.0 * math.pi, size=M)
    return RandomFourierFeatures(W=W, b=b, lengthscale=ell, signal_variance=s2)
