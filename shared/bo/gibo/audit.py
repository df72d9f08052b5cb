"""Empirical privacy audit of DP-GIBO's private gradient oracle, as the curator runs it in production.

Paper: "Scalable DP Bayesian optimisation" (DP-GIBO), Algorithm 1 lines 5-8 and Lemma 3.1. One step of the
oracle releases ``(1/n) sum_i Pi_B(W L[:, i]) + N(0, sigma^2 I_d)`` with ``sigma = 2 B sqrt(T) / (n mu)``;
replacing one user moves the clipped average by at most 2B / n, so one step is mu / sqrt(T)-GDP and the T
steps together are mu-GDP (Dong, Roth & Su 2022, Theorem 2.7 and Corollary 3.3).

The audit (``shared.privacy.audit``) attacks ONE step: the mechanism it runs is
``shared.bo.gibo.oracle.oracle_gradient`` with OpenDP's sampler (``shared.privacy.gdp.gaussian_noise``), and
the claim is the (epsilon, delta) of the per-step guarantee, ``gdp_epsilon(mu / sqrt(T), delta)``.

Neighbouring datasets (replace one row, the relation of Lemma 3.1), the worst case for the sensitivity:
the built-in gaussian-location loss (DP-GIBO s4.1; per-user gradient theta - x_i), a degree-2 polynomial
kernel (which represents the quadratic loss exactly, so the GP's gradient is the true one), and row 0 at
``theta + far e_1`` in D and at ``theta - far e_1`` in D' with ``far >> B``: its clipped gradient is
``-B e_1`` in D and ``+B e_1`` in D', so the two clean averages differ by exactly 2B / n, the sensitivity.
The other rows sit near theta (gradients inside the clipping ball) and are the same in both datasets.

Distinguisher: the likelihood-ratio test between N(g, sigma^2 I) and N(g', sigma^2 I), a threshold on the
projection ``<released - g, u>`` with ``u = (g' - g) / ||g' - g||``; g and g' are the clean averages, computed
by the same ``oracle_gradient`` with mu = inf (no noise). Under D the statistic is N(0, sigma^2), under D'
N(2B / n, sigma^2): the test is exactly as hard as the claim says, which is what makes it tight.

The control, ``half_noise_oracle_mechanism``, is the same oracle whose noise is half the std its claim
needs (a step calibrated for 2 mu, or an oracle that forgot sqrt(T) with T = 4); the audit must reject it.
As for the other controls (``shared.privacy.audit.broken_gaussian_mechanism``, the CTL control), it is not
in the registry ``pobo audit privacy`` runs by default (a control that is caught makes that command exit 1);
it lives in ``GIBO_CONTROLS`` and the tests run it.

OpenDP's sampler is seeded by the operating system, so the runs cannot be seeded: the ``rng`` the audit
passes is not used, and the bound holds (with its 95 % confidence) whatever the draw.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from shared.bo.gibo.kernels import PolynomialKernel
from shared.bo.gibo.oracle import builtin_loss_matrix, oracle_gradient
from shared.privacy.audit import Mechanism
from shared.privacy.gdp import gaussian_noise, gdp_epsilon

__all__ = [
    "GIBO_AUDITS",
    "GIBO_CONTROLS",
    "gradient_oracle_mechanism",
    "half_noise_oracle_mechanism",
    "oracle_neighbours",
]

FloatArray = npt.NDArray[np.float64]

ORACLE_NAME = "dp-gibo gradient oracle"
CONTROL_NAME = "dp-gibo oracle with half the noise (control)"


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


def gradient_oracle_mechanism(
    *,
    mu: float = 2.0,
    steps: int = 4,
    delta: float = 1e-5,
    n: int = 8,
    d: int = 2,
    clip: float = 1.0,
    noise_scale: float = 1.0,
    name: str = ORACLE_NAME,
) -> Mechanism:
    """One step of ``oracle_gradient`` (production noise) on the worst-case replace-one pair (Lemma 3.1).

    Claim: one step of a T-step, mu-GDP oracle is mu / sqrt(T)-GDP, i.e. (``gdp_epsilon(mu / sqrt(T),
    delta)``, delta)-DP (Dong, Roth & Su 2022, Corollary 2.13); the defaults (mu = 2, T = 4) make a step
    1-GDP: epsilon 4.377 at delta = 1e-5. ``noise_scale`` multiplies the std the oracle asks its sampler for
    (1: production; below 1: a broken mechanism, the control the audit must catch).
    """
    X, X2, theta, design, bounds = oracle_neighbours(n=n, d=d, clip=clip)
    kernel = PolynomialKernel(degree=2, offset=1.0)
    losses = {
        False: builtin_loss_matrix("gaussian-location", X),
        True: builtin_loss_matrix("gaussian-location", X2),
    }

    def noise(std: float, dim: int) -> FloatArray:
        return gaussian_noise(noise_scale * std, dim)

    def step(neighbour: bool, step_mu: float) -> FloatArray:
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
            noise=noise,
        )

    clean = step(False, math.inf)
    shift = step(True, math.inf) - clean
    u = shift / np.linalg.norm(shift)

    def scores(neighbour: bool, trials: int, rng: np.random.Generator) -> FloatArray:
        out = np.empty(trials)
        for i in range(trials):  # one production step per trial; OpenDP's noise ignores ``rng``
            out[i] = float(np.dot(step(neighbour, mu) - clean, u))
        return out

    return Mechanism(
        name=name,
        claimed_epsilon=gdp_epsilon(mu / math.sqrt(steps), delta),
        delta=delta,
        formal_guarantee=True,
        distinguisher=(
            "likelihood-ratio test on the replaced row (clipped gradients -B e1 vs +B e1): threshold on "
            "<g~ - g, u>, u the direction between the two clean averages"
        ),
        scores=scores,
    )


def half_noise_oracle_mechanism(*, delta: float = 1e-5, n: int = 8, d: int = 2) -> Mechanism:
    """Control: the oracle claiming 1-GDP per step while adding half the std that needs (so 2-GDP)."""
    return gradient_oracle_mechanism(delta=delta, n=n, d=d, noise_scale=0.5, name=CONTROL_NAME)


#: DP-GIBO's mechanisms for ``pobo audit privacy`` (``shared.privacy`` may not import ``shared.bo``: the
#: command passes ``AUDITS | GIBO_AUDITS`` to ``run_all``).
GIBO_AUDITS: dict[str, Callable[[], Mechanism]] = {ORACLE_NAME: gradient_oracle_mechanism}
#: Broken variants the audit must reject (run by the tests, not by default: a caught control exits 1).
GIBO_CONTROLS: dict[str, Callable[[], Mechanism]] = {CONTROL_NAME: half_noise_oracle_mechanism}
