"""The audited mechanisms of ``shared.privacy``: the Gaussian release, CTL (output privacy) and the paper's
Algorithm 1, each with its neighbouring pair, its tests and (for those that claim a guarantee) its controls.

Neighbouring pairs are fixed and chosen to be the worst case for the claim (a row moved by a norm just below
the unit; the two outcomes furthest apart after clipping) and, for the precision test, so that the two clean
values lie in different binades (where floating-point addition leaves a trace).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

from shared.privacy.audit.builders import LR_TEST, PRECISION_TEST
from shared.privacy.audit.core import FLOAT_ADDITION, SENSITIVITY_X15, Mechanism, Registry, Test
from shared.privacy.audit.precision import precision_score
from shared.privacy.audit.stats import Claim
from shared.privacy.ctl import CTL
from shared.privacy.gaussian import calibrate, gaussian_release, noisy_rows
from shared.privacy.gdp import gdp_epsilon
from shared.privacy.po_gp_ucb import release_projection
from shared.privacy.rows import FloatArray

__all__ = [
    "AUDITS",
    "ctl_audits",
    "gaussian_audits",
    "neighbouring_pair",
    "po_gp_ucb_mechanism",
]

#: The precision test's statistic, in words (one wording for every mechanism).
PRECISION_WORDS = (
    "reachability: +1 if the output cannot be fl(v + z) for D's clean value v and any float z, -1 if not for "
    "D''s, else 0"
)


def neighbouring_pair(n: int, d: int, seed: int = 0) -> tuple[FloatArray, FloatArray]:
    """(X, X'): n x d rows, and the same with row 0 moved by a norm just below 1 (the DP unit, Definition 1).

    Row 0 is (1.25, 0.5, ...) in X and (2.25 - 1e-6, 0.5, ...) in X': the move is along the first feature
    and crosses a power of two, so floating-point addition of noise would leave a trace in the bits.
    """
    rng = np.random.default_rng(seed)
    X = rng.normal(loc=2.0, scale=3.0, size=(n, d))
    X[0] = 0.5
    X[0, 0] = 1.25
    X2 = X.copy()
    X2[0, 0] += 1.0 - 1e-6
    return X, X2


def gaussian_audits(
    *, epsilon: float = 1.0, delta: float = 1e-5, n: int = 200, d: int = 2
) -> list[Mechanism]:
    """The Gaussian release (no projection: a projection is post-processing of this output), its controls.

    * Likelihood-ratio test on the whole production release: a threshold on ``<Z - X~, W> / ||W||`` with
      ``W = X~' - X~`` (the centred difference of the means), the optimal test for Gaussian noise.
    * Precision test on the mechanism's own output ``noisy_rows`` (Y, before centring: centring and projecting
      are post-processing of Y), row 0.
    * Controls: the release with noise calibrated for a 1.5x smaller sensitivity (noise multiplier z / 1.5),
      and the textbook float release ``X + N(0, sigma^2)``.

    Claim: the release is (1 / z)-GDP for one row moving by norm <= 1 (z its noise multiplier), which is
    what its (epsilon, delta) converts from and what the PLD accountant composes.
    """
    X, X2 = neighbouring_pair(n, d)
    Xc, X2c = X - X.mean(axis=0), X2 - X2.mean(axis=0)
    W = X2c - Xc
    W /= np.linalg.norm(W)
    cal = calibrate(epsilon, delta, d)
    claim = Claim("gdp", 1.0 / cal.noise_multiplier, epsilon, delta)
    weak_epsilon = gdp_epsilon(1.5 / cal.noise_multiplier, delta)
    name = "gaussian"

    def lr(run_epsilon: float) -> Test:
        def scores(neighbour: bool, trials: int, rng: np.random.Generator) -> FloatArray:
            data = X2 if neighbour else X
            out = np.empty(trials)
            for i in range(trials):  # one production release per trial
                Z = gaussian_release(data, epsilon=run_epsilon, delta=delta, rng=rng).Z
                out[i] = float(np.vdot(Z - Xc, W))
            return out

        words = "likelihood ratio on the moved row: threshold on <Z - X~, W>/||W||"
        return Test(LR_TEST, words, scores, threshold="balanced")

    def precision(floated: bool) -> Test:
        def scores(neighbour: bool, trials: int, rng: np.random.Generator) -> FloatArray:
            data = X2 if neighbour else X
            rows = np.empty((trials, d))
            for i in range(trials):
                if floated:  # the bug, on purpose: noise added to the rows in floating point
                    rows[i] = (data + cal.sigma * rng.standard_normal(data.shape))[0]
                else:  # the mechanism as the release runs it, on every row
                    rows[i] = noisy_rows(data, cal, rng)[0]
            return precision_score(rows, X[0], X2[0])

        return Test(PRECISION_TEST, PRECISION_WORDS, scores)

    runs = 50_000  # a release of 200 x 2 rows takes ~60 us: the GDP bound is then within ~0.03 of mu
    return [
        Mechanism(name, claim, True, (lr(epsilon), precision(False)), default_trials=runs),
        Mechanism(name, claim, True, (lr(weak_epsilon),), control=SENSITIVITY_X15, default_trials=runs),
        Mechanism(name, claim, True, (precision(True),), control=FLOAT_ADDITION, default_trials=runs),
    ]


def ctl_audits(*, epsilon: float = 1.0, B: float = 1.0, R: float = 1.0) -> list[Mechanism]:
    """CTL(epsilon), the output mechanism (LDP-BO, Lemma 1), through the scalar path the curator answers with.

    * Likelihood-ratio test: the person's outcome is y = +10 (B + R) or y = -10 (B + R); clipping brings both
      to the ends of [-(B + R), B + R], the largest difference the claim covers (a mechanism that forgot to
      clip would be caught). Between Laplace laws centred at -b and +b (b = B + R) the likelihood ratio is a
      monotone function of the answer clipped to [-b, b], so that is the statistic.
    * Precision test: the outcome is 10 (B + R) (clipped to b = 2) or 1.5 (a binade below), the answer tested
      for reachability from each.
    * Controls: CTL clipping to 1.5 (B + R) with the noise scale of B + R, and the clipped outcome plus
      Laplace noise added in floating point.

    The noise comes from OpenDP's OS-seeded generator, so the trials cannot be seeded: the bound holds for
    any draw. Claim: pure epsilon-DP at OpenDP's charged epsilon (what the ledger charges per answer).
    """
    ctl = CTL(epsilon, B=B, R=R)
    wide = CTL(1.5 * epsilon, B=1.5 * B, R=1.5 * R)  # clip 1.5 b, noise scale 2 (1.5 b) / (1.5 eps): b's
    far = 10.0 * ctl.bound
    inside = 0.75 * ctl.bound
    claim = Claim("pure", ctl.charged_epsilon, ctl.charged_epsilon, 0.0)
    name = "ctl (output privacy)"

    def answers(mech: CTL, values: float, trials: int) -> FloatArray:
        return np.array([mech.privatise(values) for _ in range(trials)])  # the scalar path, per answer

    def lr(mech: CTL) -> Test:
        def scores(neighbour: bool, trials: int, rng: np.random.Generator) -> FloatArray:
            raw = answers(mech, far if neighbour else -far, trials)
            out: FloatArray = np.clip(raw, -ctl.bound, ctl.bound)
            return out

        return Test(
            LR_TEST, "likelihood ratio on the answer a about one person: threshold on clip(a, -b, b)", scores
        )

    def precision(floated: bool) -> Test:
        clean_d, clean_d2 = float(ctl.clip(inside)), float(ctl.clip(far))

        def scores(neighbour: bool, trials: int, rng: np.random.Generator) -> FloatArray:
            y = far if neighbour else inside
            if floated:  # the bug, on purpose: OpenDP's noise drawn at 0, added to the clipped value in float
                out = float(ctl.clip(y)) + answers(ctl, 0.0, trials)
            else:
                out = answers(ctl, y, trials)
            return precision_score(out[:, None], clean_d, clean_d2)

        return Test(PRECISION_TEST, PRECISION_WORDS, scores)

    return [
        Mechanism(name, claim, True, (lr(ctl), precision(False))),
        Mechanism(name, claim, True, (lr(wide),), control=SENSITIVITY_X15),
        Mechanism(name, claim, True, (precision(True),), control=FLOAT_ADDITION),
    ]


def po_gp_ucb_mechanism(
    *,
    lift: Literal["auto", "always"],
    epsilon: float = 1.0,
    delta: float = 1e-5,
    n: int = 200,
    d: int = 3,
    r: int = 2,
) -> Mechanism:
    """The paper's Algorithm 1 (n > d + 1, so no guarantee holds; the audit shows it).

    Distinguisher: the column-space test. Every column of Z = X~ B lies in span(X~, 1), a d-dimensional
    subspace that moves when a row moves; the statistic is log10 of Z's relative residual off span(X, 1).
    """
    X, X2 = neighbouring_pair(n, d)
    Q, _ = np.linalg.qr(np.hstack([X, np.ones((n, 1))]))

    def scores(neighbour: bool, trials: int, rng: np.random.Generator) -> FloatArray:
        data = X2 if neighbour else X
        out = np.empty(trials)
        for i in range(trials):
            Z = release_projection(data, epsilon=epsilon, delta=delta, r=r, lift=lift, rng=rng).Z
            resid = np.linalg.norm(Z - Q @ (Q.T @ Z)) / np.linalg.norm(Z)
            out[i] = math.log10(max(float(resid), 1e-300))
        return out

    test = Test("column space", "column-space test: log10 of Z's relative residual off span(X, 1)", scores)
    return Mechanism(f"po-gp-ucb (lift={lift})", Claim("approx", epsilon, epsilon, delta), False, (test,))


#: Every mechanism of ``shared.privacy`` (each with its controls), as ``pobo audit privacy`` runs them.
AUDITS: Registry = {
    "gaussian": gaussian_audits,
    "ctl (output privacy)": ctl_audits,
    "po-gp-ucb (lift=auto)": lambda: [po_gp_ucb_mechanism(lift="auto")],
    "po-gp-ucb (lift=always)": lambda: [po_gp_ucb_mechanism(lift="always")],
}
