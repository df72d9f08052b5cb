"""The reference of ``pobo bench strategies``: what a model that never plays a row twice reaches (round 3).

Not a strategy, and not part of the rule that chose the defaults: a yardstick for the regret ratios of the
strategies that never replay a row (GP-UCB, GP-BUCB under every grant; any strategy under a grant that answers
a repeated row from its cache). It is given what no strategy is given, the variance of the noise on each
answer (the measurement noise's R^2 / 3, plus the CTL mechanism's Laplace variance 2 b^2 under output
privacy), and, on the synthetic problem, the kernel f was drawn from:

* ``synthetic``: GP-UCB (Srinivas et al. 2010) with fixed hyper-parameters, f's own squared-exponential
  kernel (lengthscale and unit signal variance of ``shared.tools.bench.synthetic``) and that noise variance,
  at the default ``beta_scale``, never repeating a row;
* the real-data problems (no kernel is known): Bayesian linear regression of the answers on the released
  rows (intercept plus the standardised columns of Z, weights a priori N(0, B^2), that noise variance),
  choosing greedily the unplayed row with the largest posterior mean (Russo et al. 2018 call this the greedy
  policy; with T <= 200 answers of 10 features it is the well-specified part of the outcome that can be
  learned).

Its T-step loop runs over plays (T <= 200), each step vectorised over the n rows.
"""

from __future__ import annotations

import numpy as np

from shared.bo.strategies import get_strategy, parse_params
from shared.privacy.ctl import CTL
from shared.tools.bench.defaults_problems import random_ratio_denominator
from shared.tools.bench.ldp import Case, study
from shared.tools.bench.ldp_problems import Problem


def noise_variance(problem: Problem, epsilon: float | None) -> float:
    """The variance of one answer's noise: the measurement noise's, plus CTL's Laplace noise's."""
    if epsilon is None:
        return problem.noise_second_moment
    assert problem.R is not None, "CTL needs a bounded noise"
    return problem.noise_second_moment + CTL(epsilon=epsilon, B=problem.B, R=problem.R).noise_variance


def greedy_linear_rows(problem: Problem, epsilon: float | None, first: int) -> np.ndarray:
    """[T] the rows the greedy Bayesian linear model plays, never one twice, ``first`` first."""
    Z = problem.Z
    n, T = Z.shape[0], problem.T
    spread = Z.std(axis=0)
    Phi = np.column_stack([np.ones(n), (Z - Z.mean(axis=0)) / np.where(spread > 0, spread, 1.0)])
    s2 = noise_variance(problem, epsilon)
    precision = np.eye(Phi.shape[1]) / problem.B**2  # prior N(0, B^2 I) on the weights
    moment = np.zeros(Phi.shape[1])
    played = np.zeros(n, dtype=bool)
    rows = np.empty(T, dtype=np.int64)
    index = int(first)
    for t in range(T):
        if t:
            mean = Phi @ np.linalg.solve(precision, moment)
            mean[played] = -np.inf
            index = int(np.argmax(mean))
        y = float(problem.outcomes(np.array([index]), np.array([t]), epsilon)[0])
        played[index] = True
        rows[t] = index
        precision += np.outer(Phi[index], Phi[index]) / s2
        moment += Phi[index] * y / s2
    return rows


def reference_ratio(
    problem: Problem, epsilon: float | None, *, state_seed: tuple[int, ...], round_seed: int
) -> float:
    """The reference's regret ratio on one run's problem (module docstring); its first row is GP-UCB's
    (the same ``state_seed``)."""
    gaps = problem.f.max() - problem.f
    random_play = random_ratio_denominator(problem)
    if problem.setting == "synthetic":
        from shared.tools.bench.synthetic import LENGTHSCALE, grid_inputs

        truth = {
            "lengthscale": LENGTHSCALE * grid_inputs()[1],
            "signal_variance": 1.0,
            "noise_variance": noise_variance(problem, epsilon),
        }
        result = study(
            problem,
            Case(problem.setting, "gp-ucb", epsilon),
            state_seed=state_seed,
            round_seed=round_seed,
            raw_params={"hyperparameters": truth},
        )
        return float(result.regret[-1] / problem.T / random_play)
    rng = np.random.default_rng(state_seed)
    n = problem.Z.shape[0]
    state = get_strategy("gp-ucb").initial_state(parse_params("gp-ucb", {}), n=n, budget=problem.T, rng=rng)
    rows = greedy_linear_rows(problem, epsilon, int(state["initial_indices"][0]))
    return float(gaps[rows].mean() / random_play)
