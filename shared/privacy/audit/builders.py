"""The audit of a mechanism that adds exact Gaussian noise to a clean value, with its two controls.

The gradient oracle (DP-GIBO) and the federation's aggregate (DP-FTS-DE) release ``clean value + Gaussian
noise`` through ``shared.privacy.lattice``; the audit of each is the same four rows:

* the production mechanism, likelihood-ratio test: the projection of the output onto the direction between
  the two clean values (the optimal test for Gaussian noise), against the mechanism's claim;
* the production mechanism, precision test (``precision.precision_score``): nothing in the output's bits
  may tell the clean values apart beyond the claim;
* the control ``sensitivity x1.5``: the same clean value, exact noise calibrated for a sensitivity 1.5x too
  small (noise multiplier z / 1.5); the likelihood-ratio test must catch it;
* the control ``float addition``: the same clean value plus the same noise added in floating point
  (``v + N(0, sigma^2)``, the bug the lattice fixes); the precision test must catch it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from shared.privacy.audit.core import FLOAT_ADDITION, SENSITIVITY_X15, Mechanism, Test
from shared.privacy.audit.precision import precision_score
from shared.privacy.audit.stats import Claim
from shared.privacy.lattice import LatticeGaussian, add_lattice_noise, lattice_gaussian
from shared.privacy.rows import FloatArray

__all__ = ["LR_TEST", "PRECISION_TEST", "exact_gaussian_audits", "projection_statistic"]

LR_TEST = "likelihood ratio"
PRECISION_TEST = "precision"

#: run(neighbour, rng) -> one output; clean(neighbour, rng) -> the value the noise is added to in that run
RunFn = Callable[[bool, np.random.Generator], npt.NDArray[np.float64]]


def projection_statistic(reference: FloatArray, direction: FloatArray) -> Callable[[FloatArray], FloatArray]:
    """``<y - reference, u>`` per output y (rows of a [trials, ...] stack), u = direction / ||direction||."""
    ref = np.asarray(reference, dtype=np.float64).ravel()
    u = np.asarray(direction, dtype=np.float64).ravel()
    u = u / np.linalg.norm(u)

    def statistic(outputs: FloatArray) -> FloatArray:
        flat = np.asarray(outputs, dtype=np.float64).reshape(outputs.shape[0], -1)
        out: FloatArray = (flat - ref) @ u
        return out

    return statistic


def _stack(run: RunFn, neighbour: bool, trials: int, rng: np.random.Generator) -> FloatArray:
    return np.stack([run(neighbour, rng) for _ in range(trials)])  # one production run per trial


def exact_gaussian_audits(
    name: str,
    claim: Claim,
    *,
    run: RunFn,
    clean: RunFn,
    references: tuple[FloatArray, FloatArray],
    lattice: LatticeGaussian,
    value_bound: float | None,
    statistic: Callable[[FloatArray], FloatArray],
    describe: str,
) -> list[Mechanism]:
    """The mechanism (``run``: the production implementation) and its two controls, as described above.

    ``clean(neighbour, rng)`` is the value the production run adds its noise to (deterministic, or the
    clean aggregate of a random sample); ``references`` are the clean values on D and D' that the precision
    test measures reachability from; ``lattice`` is the production noise (its sensitivity, multiplier, size).
    """
    weak = lattice_gaussian(
        lattice.sensitivity, lattice.noise_multiplier / 1.5, lattice.dim, value_bound=value_bound
    )

    def scaled(neighbour: bool, rng: np.random.Generator) -> FloatArray:
        return add_lattice_noise(weak, clean(neighbour, rng), rng)

    def floated(neighbour: bool, rng: np.random.Generator) -> FloatArray:
        value = np.asarray(clean(neighbour, rng), dtype=np.float64)
        out: FloatArray = value + lattice.sigma * rng.standard_normal(value.shape)  # the bug, on purpose
        return out

    def lr(fn: RunFn) -> Test:
        def scores(neighbour: bool, trials: int, rng: np.random.Generator) -> FloatArray:
            return statistic(_stack(fn, neighbour, trials, rng))

        return Test(LR_TEST, describe, scores, threshold="balanced")

    def precision(fn: RunFn) -> Test:
        def scores(neighbour: bool, trials: int, rng: np.random.Generator) -> FloatArray:
            return precision_score(_stack(fn, neighbour, trials, rng), *references)

        return Test(
            PRECISION_TEST,
            "reachability: +1 if the output cannot be fl(v + z) for D's clean value v and any float z, "
            "-1 if not for D''s, else 0",
            scores,
        )

    return [
        Mechanism(name, claim, True, (lr(run), precision(run))),
        Mechanism(name, claim, True, (lr(scaled),), control=SENSITIVITY_X15),
        Mechanism(name, claim, True, (precision(floated),), control=FLOAT_ADDITION),
    ]
