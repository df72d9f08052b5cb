"""``pobo bench strategies --gibo``: dp-gibo at its defaults on a real-data logistic regression (issue 32).

scikit-learn's breast-cancer data (the first 9 features centred, declared at their standard deviations, plus
an intercept: 10 parameters, all 569 patients), a gradient oracle with the box [-5, 5]^10, clip B = 1,
mu = 2, T = 30 steps, delta = 1e-5, run through the curator's ``oracle_gradient``; the score is the fraction
of the gap between the start's training loss and the box's optimum (L-BFGS-B) that the last iterate closes.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np

from shared.tools.bench.pool import map_runs

GIBO_FEATURES, GIBO_MU, GIBO_STEPS, GIBO_CLIP, GIBO_DELTA, GIBO_BOX = 9, 2.0, 30, 1.0, 1e-5, 5.0


@cache
def _cancer() -> tuple[np.ndarray, np.ndarray]:
    """Breast-cancer rows in declared units (the first 9 features centred, over their standard deviations),
    with the intercept's column of ones first, and the 0/1 outcome."""
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    X = data.data[:, :GIBO_FEATURES]
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    return X, data.target.astype(np.float64)


def _logistic_loss(theta: np.ndarray) -> float:
    from shared.bo.gibo.losses import logistic_regression

    X, y = _cancer()
    Z = np.hstack([np.ones((X.shape[0], 1)), X])
    return float(logistic_regression(np.asarray(theta)[None, :], Z, y).mean())


@cache
def gibo_optimum() -> float:
    """The smallest training loss in the box (L-BFGS-B from the box's centre, analytic gradient)."""
    from scipy.optimize import minimize

    X, y = _cancer()
    Z = np.hstack([np.ones((X.shape[0], 1)), X])

    def fun(theta: np.ndarray) -> tuple[float, np.ndarray]:
        z = Z @ theta
        p = 1.0 / (1.0 + np.exp(-z))
        return float(np.mean(np.logaddexp(0.0, z) - y * z)), Z.T @ (p - y) / y.size

    dim = GIBO_FEATURES + 1
    res = minimize(fun, np.zeros(dim), jac=True, method="L-BFGS-B", bounds=[(-GIBO_BOX, GIBO_BOX)] * dim)
    return float(res.fun)


def gibo_run(args: tuple[int, int]) -> dict[str, float]:
    """One dp-gibo study at its defaults against an in-process oracle; the gap it closes."""
    from shared.bo.gibo.oracle import builtin_loss_matrix, kernel_from_spec, oracle_gradient
    from shared.bo.strategies import GradientAnswer, GradientDomain, get_strategy, parse_params, round_rng

    seed, run = args
    X, y = _cancer()
    dim = GIBO_FEATURES + 1
    bounds = tuple((-GIBO_BOX, GIBO_BOX) for _ in range(dim))
    domain = GradientDomain(dimension=dim, bounds=bounds, steps=GIBO_STEPS)
    cls = get_strategy("dp-gibo")
    params = parse_params("dp-gibo", {})
    state = cls.initial_state(
        params, n=X.shape[0], budget=GIBO_STEPS, rng=np.random.default_rng([seed, run, 1])
    )
    strategy = cls(domain, params, state)
    loss_matrix = builtin_loss_matrix("logistic-regression", X, y, intercept=True)
    noise = np.random.default_rng([seed, run, 2])
    round_seed = int(np.random.default_rng([seed, run, 3]).integers(2**62))
    design: list[tuple[float, ...]] = []
    start = _logistic_loss(np.asarray(strategy.point()))
    for t in range(GIBO_STEPS):
        (request,) = strategy.plan(budget=GIBO_STEPS - t, rng=round_rng(round_seed, t))
        design += list(request.points)
        gradient = oracle_gradient(
            loss_matrix,
            n=X.shape[0],
            row_width=dim,
            theta=request.theta,
            design=design,
            bounds=bounds,
            kernel=kernel_from_spec(request.kernel),
            clip=GIBO_CLIP,
            steps=GIBO_STEPS,
            mu=GIBO_MU,
            rng=noise,
            noise_var=request.noise_var,
            jitter=request.jitter,
        )
        strategy.observe([GradientAnswer(request, tuple(float(g) for g in gradient), step=t + 1)])
    final = _logistic_loss(np.asarray(strategy.point()))
    best = gibo_optimum()
    return {"start": start, "final": final, "optimum": best, "closed": (start - final) / (start - best)}


def run_gibo(runs: int, *, seed: int = 0, workers: int = 2) -> dict[str, Any]:
    out = list(map_runs(gibo_run, [(seed, r) for r in range(runs)], workers))
    closed = np.array([o["closed"] for o in out])
    return {
        "runs": runs,
        "mu": GIBO_MU,
        "steps": GIBO_STEPS,
        "clip": GIBO_CLIP,
        "delta": GIBO_DELTA,
        "start": out[0]["start"],
        "optimum": out[0]["optimum"],
        "final_mean": float(np.mean([o["final"] for o in out])),
        "closed_mean": float(closed.mean()),
        "closed_se": float(closed.std(ddof=1) / math.sqrt(runs)) if runs > 1 else 0.0,
        "closed": closed.tolist(),
    }
