"""Empirical privacy audit: a distinguisher on a fixed pair of neighbouring datasets, turned into a lower
bound on epsilon.

If a mechanism is (epsilon, delta)-DP, every test S that says "the data was D'" obeys (Dwork & Roth 2014,
Def. 2.4, applied to S and to its complement)::

    1 - FNR <= e^epsilon FPR + delta        and        1 - FPR <= e^epsilon FNR + delta

so any observed pair of error rates implies ``epsilon >= max(ln((1 - delta - FNR) / FPR),
ln((1 - delta - FPR) / FNR))``. The audit (after Jagielski, Ullman & Oprea, NeurIPS 2020):

1. run the mechanism ``calibration_trials`` times on D and on D' and choose the distinguisher's threshold
   that promises the largest bound (these runs are then thrown away, so the choice cannot flatter the bound);
2. run it ``trials`` more times on each, count false positives and false negatives;
3. replace FPR and FNR by their one-sided Clopper-Pearson upper bounds at level alpha / 2 each, so the
   reported bound holds with probability >= 1 - alpha (union bound) whatever the mechanism is.

A sound mechanism must give a bound at or below its claimed epsilon. A perfect distinguisher (no error in
either direction) gives ``ln((1 - delta - u) / u)`` with ``u ~ 3.7 / trials``: a bound that grows without
limit as the trials grow; the result says so (``perfect_distinguisher``).

Each audited mechanism is a :class:`Mechanism`: its claim, and ``scores(neighbour, trials, rng)``, which runs
the *production* implementation once per trial on D (``neighbour=False``) or D' and returns the
distinguisher's statistic of each output (larger means "looks like D'"). Register new ones in ``AUDITS``
(mechanisms of ``shared.bo``, which this package may not import, in their own registry that ``pobo audit
privacy`` merges in: ``shared.bo.gibo.audit.GIBO_AUDITS``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np
from dp_accounting.gaussian_mechanism import get_epsilon_gaussian
from scipy import stats

from shared.privacy.ctl import CTL
from shared.privacy.gaussian import calibrate, gaussian_release
from shared.privacy.po_gp_ucb import release_projection
from shared.privacy.rows import FloatArray

__all__ = [
    "AUDITS",
    "AuditResult",
    "Mechanism",
    "choose_threshold",
    "clopper_pearson_upper",
    "ctl_mechanism",
    "epsilon_lower_bound",
    "gaussian_mechanism",
    "neighbouring_pair",
    "po_gp_ucb_mechanism",
    "run_audit",
]

Scores = Callable[[bool, int, np.random.Generator], FloatArray]


@dataclass(frozen=True)
class Mechanism:
    """An audit target: what is claimed, and the distinguisher's statistic of one run per trial."""

    name: str
    claimed_epsilon: float
    delta: float
    formal_guarantee: bool
    distinguisher: str
    scores: Scores


@dataclass(frozen=True)
class AuditResult:
    mechanism: str
    claimed_epsilon: float
    delta: float
    trials: int  # runs per dataset (D and D' each), after the calibration runs
    empirical_epsilon_lower_bound: float
    formal_guarantee: bool
    distinguisher: str
    threshold: float
    false_positives: int
    false_negatives: int
    fpr_upper: float
    fnr_upper: float
    confidence: float  # 1 - alpha
    perfect_distinguisher: bool

    @property
    def within_claim(self) -> bool:
        return self.empirical_epsilon_lower_bound <= self.claimed_epsilon

    def row(self) -> dict[str, Any]:
        return asdict(self) | {"within_claim": self.within_claim}


# ------------------------------------------------------------------------------------------ statistics


def clopper_pearson_upper(k: int, n: int, alpha: float) -> float:
    """One-sided (1 - alpha) Clopper-Pearson upper bound on a rate with k events in n trials."""
    if not (0 <= k <= n) or n < 1:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    if k == n:
        return 1.0
    return float(stats.beta.ppf(1.0 - alpha, k + 1, n - k))


def epsilon_lower_bound(fpr_upper: float, fnr_upper: float, delta: float) -> float:
    """``max(ln((1 - delta - FNR) / FPR), ln((1 - delta - FPR) / FNR), 0)`` from upper bounds on the rates."""
    best = 0.0
    for num, den in ((1.0 - delta - fnr_upper, fpr_upper), (1.0 - delta - fpr_upper, fnr_upper)):
        if num > 0 and den > 0:
            best = max(best, math.log(num / den))
    return best


def _bound(fp: int, fn: int, trials: int, delta: float, alpha: float) -> tuple[float, float, float]:
    fpr_u = clopper_pearson_upper(fp, trials, alpha / 2)
    fnr_u = clopper_pearson_upper(fn, trials, alpha / 2)
    return epsilon_lower_bound(fpr_u, fnr_u, delta), fpr_u, fnr_u


def choose_threshold(
    s0: FloatArray, s1: FloatArray, *, delta: float, trials: int, alpha: float, candidates: int = 400
) -> float:
    """The threshold whose error rates on these calibration scores promise the best bound at ``trials``.

    Candidates are midpoints between quantiles of the pooled scores (plus the extremes); the rates seen on
    the calibration runs are projected to ``trials`` runs to rank them.
    """
    pooled = np.sort(np.concatenate([s0, s1]))
    qs = np.unique(np.quantile(pooled, np.linspace(0.0, 1.0, candidates)))
    cands = np.concatenate([[pooled[0] - 1.0], 0.5 * (qs[1:] + qs[:-1]), [pooled[-1] + 1.0]])
    s0s, s1s = np.sort(s0), np.sort(s1)
    fp_rate = 1.0 - np.searchsorted(s0s, cands, side="right") / s0s.size  # P_D(s > t)
    fn_rate = np.searchsorted(s1s, cands, side="right") / s1s.size  # P_D'(s <= t)
    best_t, best = float(cands[0]), -1.0
    for t, a, b in zip(cands, fp_rate, fn_rate, strict=True):
        bound = _bound(int(round(a * trials)), int(round(b * trials)), trials, delta, alpha)[0]
        if bound > best:
            best_t, best = float(t), bound
    return best_t


def run_audit(
    mechanism: Mechanism,
    *,
    trials: int,
    calibration_trials: int | None = None,
    alpha: float = 0.05,
    rng: np.random.Generator,
) -> AuditResult:
    """Audit ``mechanism``: calibrate a threshold on fresh runs, then count errors on ``trials`` more each."""
    if trials < 10:
        raise ValueError(f"trials must be >= 10, got {trials}")
    cal = calibration_trials or max(1000, trials // 5)
    t = choose_threshold(
        mechanism.scores(False, cal, rng),
        mechanism.scores(True, cal, rng),
        delta=mechanism.delta,
        trials=trials,
        alpha=alpha,
    )
    s0 = mechanism.scores(False, trials, rng)
    s1 = mechanism.scores(True, trials, rng)
    fp, fn = int(np.count_nonzero(s0 > t)), int(np.count_nonzero(s1 <= t))
    bound, fpr_u, fnr_u = _bound(fp, fn, trials, mechanism.delta, alpha)
    return AuditResult(
        mechanism=mechanism.name,
        claimed_epsilon=mechanism.claimed_epsilon,
        delta=mechanism.delta,
        trials=trials,
        empirical_epsilon_lower_bound=bound,
        formal_guarantee=mechanism.formal_guarantee,
        distinguisher=mechanism.distinguisher,
        threshold=t,
        false_positives=fp,
        false_negatives=fn,
        fpr_upper=fpr_u,
        fnr_upper=fnr_u,
        confidence=1.0 - alpha,
        perfect_distinguisher=fp == 0 and fn == 0,
    )


# ---------------------------------------------------------------------------------- the audited releases


def neighbouring_pair(n: int, d: int, seed: int = 0) -> tuple[FloatArray, FloatArray]:
    """(X, X'): n x d data, and the same with row 0 moved by a unit vector (the DP unit, Definition 1)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(loc=2.0, scale=3.0, size=(n, d))
    v = rng.standard_normal(d)
    v /= np.linalg.norm(v) * (1.0 + 1e-12)  # norm just below 1
    X2 = X.copy()
    X2[0] += v
    return X, X2


def gaussian_mechanism(
    *,
    epsilon: float = 1.0,
    delta: float = 1e-5,
    n: int = 200,
    d: int = 2,
    run_epsilon: float | None = None,
    name: str = "gaussian",
) -> Mechanism:
    """The Gaussian release (no projection; a projection is post-processing of this output).

    Distinguisher: the likelihood-ratio test between the two output distributions, which for Gaussian noise
    is a threshold on ``<Z - X~, W> / ||W||`` with ``W = X~' - X~`` the (centred) difference of the means.
    ``run_epsilon`` runs the release at another epsilon than the one claimed: a deliberately broken
    mechanism, the control that the audit must catch.
    """
    X, X2 = neighbouring_pair(n, d)
    Xc, X2c = X - X.mean(axis=0), X2 - X2.mean(axis=0)
    W = X2c - Xc
    W /= np.linalg.norm(W)
    eps_run = epsilon if run_epsilon is None else run_epsilon

    def scores(neighbour: bool, trials: int, rng: np.random.Generator) -> FloatArray:
        data = X2 if neighbour else X
        out = np.empty(trials)
        for i in range(trials):  # one production release per trial
            Z = gaussian_release(data, epsilon=eps_run, delta=delta, rng=rng).Z
            out[i] = float(np.vdot(Z - Xc, W))
        return out

    return Mechanism(
        name=name,
        claimed_epsilon=epsilon,
        delta=delta,
        formal_guarantee=True,
        distinguisher="likelihood-ratio test on the moved row: threshold on <Z - X~, W>/||W||",
        scores=scores,
    )


def broken_gaussian_mechanism(*, epsilon: float = 1.0, delta: float = 1e-5) -> Mechanism:
    """Control: claims epsilon but adds half the noise the claim needs (the audit must reject it)."""
    run_eps = float(get_epsilon_gaussian(calibrate(epsilon, delta, 2).noise_multiplier / 2.0, delta))
    return gaussian_mechanism(
        epsilon=epsilon, delta=delta, run_epsilon=run_eps, name="gaussian with half the noise (control)"
    )


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

    return Mechanism(
        name=f"po-gp-ucb (lift={lift})",
        claimed_epsilon=epsilon,
        delta=delta,
        formal_guarantee=False,
        distinguisher="column-space test: log10 of Z's relative residual off span(X, 1)",
        scores=scores,
    )


def ctl_mechanism(
    *, epsilon: float = 1.0, B: float = 1.0, R: float = 1.0, run_scale: float | None = None
) -> Mechanism:
    """CTL(epsilon), the output mechanism (LDP-BO, Lemma 1), on the two outcomes furthest apart.

    Neighbours: the person's outcome is y = +10 (B + R) or y = -10 (B + R): clipping brings both to the
    ends of [-(B + R), B + R], the largest difference the claim covers (and a mechanism that forgot to clip
    would be caught). Distinguisher: the likelihood-ratio test. Between Laplace laws centred at -b and +b
    (b = B + R) the likelihood ratio is exp((|a + b| - |a - b|) / scale), a monotone function of the answer
    a clipped to [-b, b]; it is flat beyond, so the statistic is that clipped answer. ``run_scale``
    runs OpenDP's sampler at another scale than the claim needs: the control the audit must catch. The noise
    comes from OpenDP's OS-seeded generator, so the trials cannot be seeded: the bound holds for any draw.
    """
    ctl = CTL(epsilon, B=B, R=R)
    runs = ctl if run_scale is None else CTL(ctl.sensitivity / run_scale, B=B, R=R)
    far = 10.0 * ctl.bound

    def scores(neighbour: bool, trials: int, rng: np.random.Generator) -> FloatArray:
        answers: FloatArray = runs.privatise(np.full(trials, far if neighbour else -far))
        return np.clip(answers, -ctl.bound, ctl.bound)

    return Mechanism(
        name="ctl (output privacy)" if run_scale is None else "ctl with half the noise (control)",
        claimed_epsilon=ctl.charged_epsilon,
        delta=0.0,
        formal_guarantee=True,
        distinguisher="likelihood-ratio test on the answer a about one person: threshold on clip(a, -b, b)",
        scores=scores,
    )


#: Every mechanism pobo ships, as ``pobo audit privacy`` runs them.
AUDITS: dict[str, Callable[[], Mechanism]] = {
    "gaussian": gaussian_mechanism,
    "ctl (output privacy)": ctl_mechanism,
    "po-gp-ucb (lift=auto)": lambda: po_gp_ucb_mechanism(lift="auto"),
    "po-gp-ucb (lift=always)": lambda: po_gp_ucb_mechanism(lift="always"),
}


def run_all(
    names: list[str] | None = None,
    *,
    trials: int = 50_000,
    calibration_trials: int | None = None,
    seed: int = 0,
    alpha: float = 0.05,
    progress: Callable[[str], None] | None = None,
    registry: Mapping[str, Callable[[], Mechanism]] | None = None,
) -> list[AuditResult]:
    """Audit the registered mechanisms (all, or ``names``), each with its own seeded stream.

    ``registry`` (default ``AUDITS``): the mechanisms to choose from, by name. ``shared.privacy`` may not
    import ``shared.bo``, so mechanisms defined there (DP-GIBO's oracle, ``shared.bo.gibo.audit``) are
    passed in by the caller, e.g. ``AUDITS | GIBO_AUDITS`` (``pobo audit privacy``).
    """
    known = AUDITS if registry is None else registry
    unknown = sorted(set(names or []) - set(known))
    if unknown:
        raise ValueError(f"unknown mechanism(s) {unknown}: choose from {sorted(known)}")
    results = []
    for k, name in enumerate(names or list(known)):
        if progress:
            progress(name)
        rng = np.random.default_rng([seed, k])
        results.append(
            run_audit(
                known[name](), trials=trials, calibration_trials=calibration_trials, alpha=alpha, rng=rng
            )
        )
    return results
