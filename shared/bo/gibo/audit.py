"""Empirical privacy audit of DP-GIBO's private gradient oracle, as the curator runs it in production.

Paper: "Scalable DP Bayesian optimisation" (DP-GIBO), Algorithm 1 lines 5-8 and Lemma 3.1. One step of the
oracle releases ``(1/n) sum_i Pi_B(W L[:, i]) + N(0, sigma^2 I_d)`` with ``sigma = 2 B sqrt(T) / (n mu)``
(plus the lattice's 2^-20), the noise added exactly (``shared.privacy.lattice``); replacing one user moves
the clipped average by at most 2B / n, so one step is mu / sqrt(T)-GDP and the T steps together are mu-GDP
(Dong, Roth & Su 2022, Theorem 2.7 and Corollary 3.3).

The audit (``shared.privacy.audit``) attacks ONE step: the mechanism it runs is
``shared.bo.gibo.oracle.oracle_gradient`` (its noise drawn from the audit's seeded AES-CTR generator, the
production generator class), and the claim is the per-step guarantee, mu / sqrt(T)-GDP (printed as
``gdp_epsilon(mu / sqrt(T), delta)``).

Neighbouring datasets (replace one row, the relation of Lemma 3.1), the worst case for the sensitivity:
the built-in gaussian-location loss (DP-GIBO s4.1; per-user gradient theta - x_i), a degree-2 polynomial
kernel (which represents the quadratic loss exactly, so the GP's gradient is the true one), and row 0 at
``theta + far e_1`` in D and at ``theta - far e_1`` in D' with ``far >> B``: its clipped gradient is
``-B e_1`` in D and ``+B e_1`` in D', so the two clean averages differ by exactly 2B / n, the sensitivity.
The other rows sit near theta (gradients inside the clipping ball) and are the same in both datasets.

Tests and controls (``shared.privacy.audit.builders``): the likelihood-ratio test (the projection
``<released - g, u>`` with ``u`` the direction between the two clean averages g and g', computed by the same
``oracle_gradient`` with mu = inf), the precision test, and the controls ``sensitivity x1.5`` (noise for a
sensitivity 1.5x too small) and ``float addition`` (``g + N(0, sigma^2)`` in floating point: the oracle as
it was before its noise was made exact, which the precision test caught on 7 % of D's outputs).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from shared.bo.gibo.kernels import PolynomialKernel
from shared.bo.gibo.oracle import builtin_loss_matrix, oracle_gradient
from shared.bo.gibo.private_gradient import step_mechanism
from shared.privacy.audit import Claim, Mechanism, Registry, exact_gaussian_audits, projection_statistic
from shared.privacy.gdp import gdp_epsilon

__all__ = ["GIBO_AUDITS", "gradient_oracle_audits", "oracle_neighbours"]

FloatArray = npt.NDArray[np.float64]

ORACLE_NAME = "dp-gibo gradient oracle"


def oracle_neighbours(
    *, n: int = 8, d: int = 2, clip: float = 1.0, far: float = 10.0, seed: int = 0
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]:
    """(X, X', theta, design, bounds): the fixed replace-one pair of the audit (see the module docstring).

    theta = 0 inside the bounds [-1, 1]^d; the design is theta plus 4 (d + 1) (d + 2) / 2 points drawn in the
    bounds (more than the dimension of the degree-2 polynomial features, so the quadratic loss is exact);
    rows 1..n-1 lie within 0.3 clip of theta (unclipped gradients); row 0 is theta + far clip e_1 in X and
    theta - far clip e_1 in X'.
    """
    if n < 2 or d < 1 or not (math.isfinite(clip) and clip > 0) or far <= 1:
        raise ValueError(
            f"need n >= 2, d >= 1, clip > 0 and far > 1, got n={n}, d={d}, clip={clip}, far={far}"
        )
    rng = np.random.default_rng(seed)
    theta = np.zeros(d)
    bounds = np.tile([-1.0, 1.0], (d, 1))
    m = 2 * (d + 1) * (d + 2)
    design = np.vstack([theta, rng.uniform(-1.0, 1.0, size=(m - 1, d))])
    X = theta + 0.3 * clip * rng.uniform(-1.0, 1.0, size=(n, d)) / math.sqrt(d)
    X2 = X.copy()
    X[0] = theta
    X2[0] = theta
    X[0, 0] += far * clip
    X2[0, 0] -= far * clip
    return X, X2, theta, design, bounds


def gradient_oracle_audits(
    *,
    mu: float = 2.0,
    steps: int = 4,
    delta: float = 1e-5,
    n: int = 8,
    d: int = 2,
    clip: float = 1.0,
) -> list[Mechanism]:
    """One step of ``oracle_gradient`` (production noise) on the worst-case replace-one pair (Lemma 3.1), and
    its controls.

    Claim: one step of a T-step, mu-GDP oracle is mu / sqrt(T)-GDP, i.e. (``gdp_epsilon(mu / sqrt(T),
    delta)``, delta)-DP (Dong, Roth & Su 2022, Corollary 2.13); the defaults (mu = 2, T = 4) make a step
    1-GDP: epsilon 4.377 at delta = 1e-5.
    """
    X, X2, theta, design, bounds = oracle_neighbours(n=n, d=d, clip=clip)
    kernel = PolynomialKernel(degree=2, offset=1.0)
    losses = {
        False: builtin_loss_matrix("gaussian-location", X),
        True: builtin_loss_matrix("gaussian-location", X2),
    }

    def step(neighbour: bool, step_mu: float, rng: np.random.Generator | None) -> FloatArray:
        return oracle_gradient(
            losses[neighbour],
            n=n,
            row_width=d,
            theta=theta,
            design=design,
            bounds=bounds,
            kernel=kernel,
            clip=clip,
            steps=steps,
            mu=step_mu,
            rng=rng,
        )

    clean = {False: step(False, math.inf, None), True: step(True, math.inf, None)}
    lattice = step_mechanism(clip, steps, n, mu, d)
    assert lattice is not None  # noqa: S101 - mu is finite
    mu_step = mu / math.sqrt(steps)
    return exact_gaussian_audits(
        ORACLE_NAME,
        Claim("gdp", mu_step, gdp_epsilon(mu_step, delta), delta),
        run=lambda neighbour, rng: step(neighbour, mu, rng),
        clean=lambda neighbour, rng: clean[neighbour],
        references=(clean[False], clean[True]),
        lattice=lattice,
        value_bound=clip,
        statistic=projection_statistic(clean[False], clean[True] - clean[False]),
        describe=(
            "likelihood ratio on the replaced row (clipped gradients -B e1 vs +B e1): threshold on "
            "<g~ - g, u>, u the direction between the two clean averages"
        ),
    )


#: DP-GIBO's mechanisms for ``pobo audit privacy`` (``shared.privacy`` may not import ``shared.bo``: the
#: command merges this registry with ``shared.privacy.audit.AUDITS``).
GIBO_AUDITS: Registry = {ORACLE_NAME: gradient_oracle_audits}
