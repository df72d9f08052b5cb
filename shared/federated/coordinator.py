"""The coordinator's step of DP-FTS-DE (Algorithm 1), with the agent list frozen before round 0.

Paper: DP-FTS-DE (Dai, Low & Jaillet, NeurIPS 2021), Algorithm 1 (lines 5-11) and Section 3.3
("Subsampling", "Clipping", "Weighted Average", "Gaussian Noise"); the softmax weights of Section 3.2.

Shapes, exactly as Algorithm 1 has them: each agent n submits ONE vector omega_{n,t} [M] (a sample of eq. 2);
it is NOT split into P parts. Line 9 clips it once to norm S / sqrt(P); line 10 adds it to every sub-region's
aggregate with that sub-region's weight, omega_t^(i) += (varphi_n^(i) / q) hat omega_{n,t}; line 11 adds
N(0, (z varphi_max S / q)^2 I) to each omega_t^(i) [M]. The output is omega_t^joint = (omega_t^(i))_i, [P, M].
Per agent, the joint contribution (varphi_n^(i) hat omega_{n,t} / q)_i has norm
<= sqrt(P varphi_max^2 S^2 / P) / q = varphi_max S / q, exactly the noise std over z: one Poisson-subsampled
Gaussian mechanism with noise multiplier z per round (Section 3.3; ``shared.federated.privacy``).

Corrections of issue 16 (what keeps the guarantee): N and the assignment i_n are those of the agent list
FROZEN before round 0; varphi (and so varphi_max and the noise std) depend only on that list and on the
temperature schedule declared at creation, never on who submitted; a sampled agent that did not submit (a
straggler, a dropped connection) and an unsampled agent both contribute 0, and nothing is renormalised.
The neighbouring relation is zero-out (an agent's submissions replaced by nothing).

Notation (shapes in brackets)::

    N                  size of the frozen agent list;  P sub-regions;  M features
    assignment  [N]    i_n, the sub-region of agent n (round robin: n mod P)
    1_n^(i)            1 if i_n = i else 0
    varphi     [P, N]  varphi_n^(i) = exp((a 1_n^(i) + 1) / T) / sum_n' exp((a 1_n'^(i) + 1) / T), a = 15
    T_t                temperature of round t: 1 at the start, growing towards +inf (uniform weights)
    S_t     [N] bool   Poisson sample: agent n in S_t independently with probability q (line 6)
    hat omega  [N, M]  omega_n / max(1, ||omega_n|| / (S / sqrt(P)))          (line 9; 0 if absent)
    omega_t^(i) [M]    (1/q) sum_{n in S_t, submitted} varphi_n^(i) hat omega_n + N(0, sigma^2 I)   (l. 10-11)
    sigma              z varphi_max S / q,  varphi_max = max_{i, n} varphi_n^(i)
                       (x (1 + 2^k sqrt(P M) q / (varphi_max S)) <= 1 + 2^-20: the lattice, below)

Noise, exactly. Line 11's sum is never computed in floating point (``aggregate + eta`` leaks the aggregate
through the low-order bits of the result: Jin et al., IEEE S&P 2022; a perfect test on 16 % of rounds at
q = 1). ``round_mechanism`` is the exact Gaussian mechanism of ``shared.privacy.lattice`` on the [P, M]
aggregate: sensitivity varphi_max S / q (one agent's joint contribution), noise multiplier z, a lattice of
step 2^k <= 2^-20 varphi_max S / (q sqrt(P M)) whose rounding is added to the sensitivity, so every round
stays exactly the Poisson-subsampled Gaussian mechanism with noise multiplier z that the accountant composes.
The noise comes from ``rng`` (production: ``shared.privacy.rng.os_entropy_rng()``, AES-CTR keyed from the OS).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from shared.errors import InputDataError
from shared.federated.regions import round_robin
from shared.privacy.lattice import LatticeGaussian, add_lattice_noise, exact_sum, lattice_gaussian, sum_slack
from shared.privacy.rng import os_entropy_rng

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

__all__ = [
    "DEFAULT_A",
    "TemperatureSchedule",
    "aggregate_round",
    "clean_aggregate",
    "clip_rows",
    "noise_std",
    "poisson_sample",
    "round_mechanism",
    "softmax_weights",
]

DEFAULT_A = 15.0


def _finite(name: str, value: float, *, low: float, low_open: bool, high: float = math.inf) -> float:
    value = float(value)
    ok = math.isfinite(value) and (value > low if low_open else value >= low) and value <= high
    if not ok:
        raise InputDataError(
            f"{name} must be a finite number {'>' if low_open else '>='} {low}, got {value!r}"
        )
    return value


def _q(q: float) -> float:
    q = float(q)
    if not (math.isfinite(q) and 0.0 < q <= 1.0):
        raise InputDataError(f"q must be in (0, 1], got {q!r}")
    return q


@dataclass(frozen=True)
class TemperatureSchedule:
    """T_t of the softmax weights (Section 3.2: "gradually increase the temperature T from 1 to +inf").

    T_t = 1 for rounds t < ``hold``; then T_t = 1 + ``growth`` (t - hold); and T_t = +inf (uniform weights
    1/N) from round ``uniform_from`` on, if set. Declared at federation creation and public. The paper's
    App. B details are not in our copy; the authors' landmine code instead uses a weight constant of 16 for
    10 rounds, falling linearly to 1 over 30 rounds; ``TemperatureSchedule(hold=10, growth=g,
    uniform_from=40)`` approximates its shape, not its values.
    """

    hold: int = 0
    growth: float = 0.0
    uniform_from: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.hold, bool) or not isinstance(self.hold, int) or self.hold < 0:
            raise InputDataError(f"hold must be an integer >= 0, got {self.hold!r}")
        _finite("growth", self.growth, low=0.0, low_open=False)
        u = self.uniform_from
        if u is not None and (isinstance(u, bool) or not isinstance(u, int) or u < 0):
            raise InputDataError(f"uniform_from must be an integer >= 0 or None, got {u!r}")

    def temperature(self, t: int) -> float:
        """T_t for round t >= 0 (math.inf means uniform weights)."""
        if isinstance(t, bool) or not isinstance(t, int | np.integer) or t < 0:
            raise InputDataError(f"round t must be an integer >= 0, got {t!r}")
        if self.uniform_from is not None and t >= self.uniform_from:
            return math.inf
        return 1.0 + self.growth * max(0, int(t) - self.hold)

    def to_public(self) -> dict[str, Any]:
        return {"hold": self.hold, "growth": float(self.growth), "uniform_from": self.uniform_from}

    @classmethod
    def from_public(cls, data: Mapping[str, Any]) -> TemperatureSchedule:
        try:
            u = data.get("uniform_from")
            return cls(
                hold=int(data.get("hold", 0)),
                growth=float(data.get("growth", 0.0)),
                uniform_from=None if u is None else int(u),
            )
        except (TypeError, ValueError) as exc:
            raise InputDataError(f"malformed temperature schedule: {exc}") from None


def softmax_weights(
    assignment: npt.ArrayLike, P: int, temperature: float, *, a: float = DEFAULT_A
) -> FloatArray:
    """varphi [P, N]: varphi_n^(i) = exp((a 1_n^(i) + 1) / T) / sum_n' exp((a 1_n'^(i) + 1) / T) (Sec. 3.2).

    Computed over the whole frozen list ``assignment`` [N] (never over who submitted). Each row sums to 1;
    T = +inf gives 1/N everywhere. The "+1" cancels in the softmax and is kept only to match the paper.
    """
    assign = np.asarray(assignment)
    if assign.ndim != 1 or assign.size < 1 or not np.issubdtype(assign.dtype, np.integer):
        raise InputDataError(f"assignment must be a non-empty integer vector, got shape {assign.shape}")
    if isinstance(P, bool) or not isinstance(P, int | np.integer) or P < 1:
        raise InputDataError(f"P must be an integer >= 1, got {P!r}")
    if (assign < 0).any() or (assign >= P).any():
        raise InputDataError(
            f"assignment values must lie in [0, {P}), got range [{assign.min()}, {assign.max()}]"
        )
    T = float(temperature)
    if math.isnan(T) or T < 1.0:
        raise InputDataError(f"temperature must be >= 1 (or inf), got {temperature!r}")
    a = _finite("a", a, low=0.0, low_open=True)
    N = assign.shape[0]
    if math.isinf(T):
        return np.full((int(P), N), 1.0 / N)
    ind = (assign[None, :] == np.arange(int(P))[:, None]).astype(np.float64)  # 1_n^(i), [P, N]
    logits = (a * ind + 1.0) / T
    logits -= logits.max(axis=1, keepdims=True)
    w = np.exp(logits)
    varphi: FloatArray = w / w.sum(axis=1, keepdims=True)
    return varphi


def round_mechanism(varphi: npt.ArrayLike, *, S: float, q: float, z: float, M: int) -> LatticeGaussian:
    """The exact Gaussian mechanism of one round on the [P, M] aggregate (Algorithm 1, line 11).

    Sensitivity varphi_max S / q: one agent's joint contribution (varphi_n^(i) hat omega_n / q)_i has norm
    <= varphi_max S / q; noise multiplier z; P M entries, each |entry| <= S / (q sqrt(P)) (the weights of a
    sub-region sum to 1 and ||hat omega_n|| <= S / sqrt(P)).
    """
    S = _finite("S", S, low=0.0, low_open=True)
    z = _finite("z", z, low=0.0, low_open=True)
    q = _q(q)
    weights = np.asarray(varphi, dtype=np.float64)
    P = int(weights.shape[0]) if weights.ndim == 2 else 1
    N = int(weights.shape[-1])
    bound = S / (q * math.sqrt(P))
    # one agent's joint contribution, plus what the exact sum over the N agents adds (``sum_slack``)
    s = float(np.max(weights)) * S / q + sum_slack(N, bound, P * int(M), mean=False)
    return lattice_gaussian(s, z, P * int(M), value_bound=bound)


def noise_std(varphi: npt.ArrayLike, *, S: float, q: float, z: float, M: int = 1) -> float:
    """sigma = z varphi_max S / q (Algorithm 1, line 11), varphi_max over the frozen list's weights, with the
    lattice's term (at most 2^-20 of it; ``round_mechanism``)."""
    return round_mechanism(varphi, S=S, q=q, z=z, M=M).sigma


def clip_rows(W: npt.ArrayLike, bound: float) -> FloatArray:
    """hat omega_n = omega_n / max(1, ||omega_n|| / bound), row-wise (Algorithm 1 line 9; bound S/sqrt(P))."""
    A = np.asarray(W, dtype=np.float64)
    norms = np.linalg.norm(A, axis=-1, keepdims=True)
    clipped: FloatArray = A / np.maximum(1.0, norms / float(bound))
    return clipped


def poisson_sample(N: int, q: float, *, rng: np.random.Generator) -> BoolArray:
    """S_t as a mask [N]: each agent of the frozen list independently with probability q (Algorithm 1,
    line 6; Section 3.3 "Subsampling"). Production: ``rng = shared.privacy.rng.os_entropy_rng()``."""
    if isinstance(N, bool) or not isinstance(N, int | np.integer) or N < 1:
        raise InputDataError(f"N must be an integer >= 1, got {N!r}")
    return np.asarray(rng.random(int(N)) < _q(q), dtype=np.bool_)


def _sample_mask(sampled: Any, N: int) -> BoolArray:
    arr = np.asarray(sampled)
    if arr.dtype == np.bool_:
        if arr.shape != (N,):
            raise InputDataError(f"a boolean sample mask must have shape ({N},), got shape {arr.shape}")
        return arr
    idx = np.asarray(sorted(int(i) for i in sampled), dtype=np.int64)
    if idx.size and (idx[0] < 0 or idx[-1] >= N):
        raise InputDataError(f"sampled agent indices must lie in [0, {N}), got range [{idx[0]}, {idx[-1]}]")
    mask = np.zeros(N, dtype=np.bool_)
    mask[idx] = True
    return mask


def clean_aggregate(
    N: int,
    submissions: Mapping[int, npt.ArrayLike],
    sampled: Any,
    *,
    M: int,
    P: int,
    S: float,
    q: float,
    temperature: float,
    assignment: npt.ArrayLike | None = None,
    a: float = DEFAULT_A,
) -> tuple[FloatArray, FloatArray]:
    """(aggregate before noise [P, M], varphi [P, N]): Algorithm 1, lines 5-10 (see ``aggregate_round``)."""
    if isinstance(N, bool) or not isinstance(N, int | np.integer) or N < 1:
        raise InputDataError(f"N must be an integer >= 1, got {N!r}")
    if isinstance(M, bool) or not isinstance(M, int | np.integer) or M < 1:
        raise InputDataError(f"M must be an integer >= 1, got {M!r}")
    N, M = int(N), int(M)
    S = _finite("S", S, low=0.0, low_open=True)
    q = _q(q)
    assign = round_robin(N, P) if assignment is None else np.asarray(assignment)
    if assign.shape != (N,):
        raise InputDataError(f"assignment must have shape ({N},), got shape {assign.shape}")
    varphi = softmax_weights(assign, P, temperature, a=a)  # [P, N], frozen list only
    mask = _sample_mask(sampled, N)

    keys = np.fromiter((int(k) for k in submissions), dtype=np.int64, count=len(submissions))
    if keys.size and (keys.min() < 0 or keys.max() >= N):
        raise InputDataError(
            f"submission agent indices must lie in [0, {N}), got range [{keys.min()}, {keys.max()}]"
        )
    Wsub = np.zeros((N, M))  # omega_{n,t}; 0 for an agent that did not submit
    if keys.size:
        rows = np.asarray([np.asarray(submissions[k], dtype=np.float64) for k in submissions.keys()])
        if rows.shape != (keys.size, M):
            raise InputDataError(
                f"each submission must be a vector of length {M}, got shape {rows.shape[1:]}"
            )
        if not np.isfinite(rows).all():
            raise InputDataError("submissions must be finite")
        Wsub[keys] = rows
    Wsub[~mask] = 0.0  # unsampled agents contribute 0 (line 8 loops over S_t only)

    W_hat = clip_rows(Wsub, S / math.sqrt(P))  # line 9, [N, M]
    # line 10: sum_n varphi_n^(i) hat omega_n / q, [P, M]. Each agent's weighted contribution is computed on
    # its own, then the N of them are summed exactly (a float sum's rounding would depend on every agent)
    contributions = varphi.T[:, :, None] * W_hat[:, None, :] / q  # [N, P, M]
    aggregate: FloatArray = exact_sum(contributions, S / (q * math.sqrt(P))).value
    return aggregate, varphi


def aggregate_round(
    N: int,
    submissions: Mapping[int, npt.ArrayLike],
    sampled: Any,
    *,
    M: int,
    P: int,
    S: float,
    q: float,
    z: float,
    temperature: float,
    rng: np.random.Generator | None = None,
    assignment: npt.ArrayLike | None = None,
    a: float = DEFAULT_A,
) -> FloatArray:
    """omega_t^joint [P, M]: Algorithm 1, lines 5-11, over the frozen list of N agents.

    ``submissions`` maps an agent index in [0, N) to its omega_{n,t} [M]; a missing index did not submit.
    ``sampled`` is S_t: a boolean mask [N] or an iterable of indices (``poisson_sample``). Only agents both
    sampled and submitted contribute; everyone else contributes 0 and no weight is renormalised. The noise
    std z varphi_max S / q and the weights come from the frozen ``assignment`` [N] (default round robin
    n mod P) and ``temperature`` only. The Gaussian noise of line 11 is added exactly (``round_mechanism``:
    the aggregate snapped to a public lattice, integer noise), drawn from ``rng`` (None: a fresh OS-keyed
    AES-CTR generator, production); row i of the result is sub-region i.
    """
    z = _finite("z", z, low=0.0, low_open=True)
    aggregate, varphi = clean_aggregate(
        N, submissions, sampled, M=M, P=P, S=S, q=q, temperature=temperature, assignment=assignment, a=a
    )
    mechanism = round_mechanism(varphi, S=S, q=q, z=z, M=int(M))  # line 11
    result: FloatArray = add_lattice_noise(mechanism, aggregate, rng if rng is not None else os_entropy_rng())
    return result
