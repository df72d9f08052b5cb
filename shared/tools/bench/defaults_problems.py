"""The problems of ``pobo bench strategies`` (``shared.tools.bench.defaults``, whose docstring states them):
three input-private releases, each run's f and the stored noise, answered as the service answers (round 3).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

from shared.tools.bench.ldp_problems import Problem

PROBLEMS = ("synthetic", "diabetes", "demo-hospital")
T_DEFAULT = 200
#: Plays per study, by problem (``T_DEFAULT`` elsewhere).
T_OF_PROBLEM = {"diabetes": 100}
EPSILON_INPUT, DELTA_INPUT = 1.0, 1e-5


@dataclass(frozen=True)
class Declared:
    """What the curator declares of a problem's outcome: the bound B on |f| and R on the noise."""

    B: float
    R: float


DECLARED = {
    "synthetic": Declared(4.0, 1.0),
    "diabetes": Declared(175.0, 10.0),
    "demo-hospital": Declared(50.0, 1.0),
}


@cache
def problem_data(name: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(X in declared units [n, d], f [n] or None for the synthetic problem, whose f is drawn per run)."""
    if name == "synthetic":
        from shared.tools.bench.synthetic import grid_inputs

        return grid_inputs()[0], None
    if name == "diabetes":
        from sklearn.datasets import load_diabetes

        X, y = load_diabetes(return_X_y=True, scaled=False)
        unit = 0.01 * (X.max(axis=0) - X.min(axis=0))
        return X / unit, np.asarray(y, dtype=np.float64) - 175.0
    if name == "demo-hospital":
        from shared.tools.data.make_demo_dataset import DP_UNITS, FEATURES, OUTCOME, PATH

        table = np.genfromtxt(PATH, delimiter=",", names=True, dtype=None, encoding="utf-8")
        X = np.column_stack([table[c].astype(np.float64) for c in FEATURES])
        y = table[OUTCOME].astype(np.float64)
        return X / np.array([DP_UNITS[c] for c in FEATURES]), y - 50.0
    raise ValueError(f"unknown problem {name!r}; the problems are {', '.join(PROBLEMS)}")


@dataclass(frozen=True)
class ServiceProblem(Problem):
    """A run's problem answered as the service answers it (round 3): ``eta`` [n] is each row's one stored
    measurement noise; under CTL a row's answer is its cached one (``cached_laplace`` [n]), or, on a grant
    with ``fresh_repeats``, fresh Laplace noise per play (``laplace`` [T]) on the same stored outcome."""

    plays: int
    cached_laplace: np.ndarray
    fresh_repeats: bool = False

    @property
    def T(self) -> int:
        return self.plays

    def outcomes(self, rows: np.ndarray, positions: np.ndarray, epsilon: float | None) -> np.ndarray:
        y: np.ndarray = self.f[rows] + self.eta[rows]
        if epsilon is None:
            return y
        draws = self.laplace[positions] if self.fresh_repeats else self.cached_laplace[rows]
        return self.through_ctl(y, draws, epsilon)


def make_problem(name: str, seed: int, run: int, T: int) -> ServiceProblem:
    """One run's problem: the release of the declared-unit rows, f on the rows, the stored noise and the
    Laplace draws (cached per row, fresh per play)."""
    from shared.privacy.gaussian import gaussian_release
    from shared.tools.bench.synthetic import _grid_factor, sample_f

    X, f = problem_data(name)
    if f is None:
        f = sample_f(np.random.default_rng([seed, run, 1]), _grid_factor())
    release_rng = np.random.default_rng([seed, run, 2])
    Z = gaussian_release(X, epsilon=EPSILON_INPUT, delta=DELTA_INPUT, rng=release_rng).Z
    declared = DECLARED[name]
    noise = np.random.default_rng([seed, run, 3])
    n = Z.shape[0]
    return ServiceProblem(
        setting=name,
        Z=Z,
        f=f,
        B=declared.B,
        R=declared.R,
        eta=np.asarray(noise.uniform(-declared.R, declared.R, n)),
        laplace=noise.laplace(0.0, 1.0, T),
        kernel="se",
        lengthscale=1.0,  # unused: the strategies run at their defaults
        noise_second_moment=declared.R**2 / 3.0,
        extra={"n": float(n), "d": float(Z.shape[1])},
        plays=T,
        cached_laplace=np.asarray(noise.laplace(0.0, 1.0, n)),
    )


def random_ratio_denominator(problem: Problem) -> float:
    """The expected regret of one uniformly random play: mean(max f - f)."""
    return float(np.mean(problem.f.max() - problem.f))
