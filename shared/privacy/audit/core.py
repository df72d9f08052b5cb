"""Running an audit: a mechanism, its tests, the runs on D and D', and the verdict.

The procedure (after Jagielski, Ullman & Oprea, NeurIPS 2020), for each test of each mechanism:

1. run the mechanism ``calibration_trials`` times on D and on D' and choose the test's threshold that
   promises the highest lower bound on the claim's level (these runs are then thrown away, so the choice
   cannot flatter the bound);
2. run it ``trials`` more times on each, count false positives and false negatives;
3. replace FPR and FNR by their one-sided Clopper-Pearson upper bounds at level alpha / 2 each, and turn them
   into lower bounds on the claim's level and on epsilon (``stats``): both hold with probability
   >= 1 - alpha (union bound) whatever the mechanism is. ``run_all`` splits alpha over the rows of a run
   (Bonferroni), and the default alpha is 1e-3: a sound mechanism whose test is tight (CTL's, whose OpenDP
   noise cannot be seeded) is then reported over its claim by chance in at most 1 run in 1000, and the
   controls are still caught by a wide margin.

A mechanism *exceeds its claim* when either bound is above what it claims. A sound mechanism must not; a
**control** (the same mechanism with a planted error: noise calibrated for a sensitivity 1.5x too small, or
noise added in floating point) must, and is then *caught*. A perfect distinguisher (no error either way)
gives a bound that only the number of trials limits (``perfect_distinguisher``).

A :class:`Mechanism` runs the *production* implementation: each test's ``scores(neighbour, trials, rng)``
runs it once per trial on D (``neighbour=False``) or D' and returns the test's statistic of each output
(larger means "looks like D'"). Mechanisms are registered by name, each with its controls
(``shared.privacy.audit.mechanisms.AUDITS``; ``shared.bo`` and ``shared.federated`` keep their own registries,
which ``pobo audit privacy`` merges in).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

from shared.privacy.audit.stats import Claim, clopper_pearson_upper, epsilon_lower_bound
from shared.privacy.rng import seeded_rng
from shared.privacy.rows import FloatArray

__all__ = [
    "ALPHA",
    "FLOAT_ADDITION",
    "SENSITIVITY_X15",
    "AuditResult",
    "Mechanism",
    "Registry",
    "Test",
    "choose_threshold",
    "run_all",
    "run_audit",
    "run_test",
]

Scores = Callable[[bool, int, np.random.Generator], FloatArray]

#: The two controls every mechanism that claims a guarantee is audited with.
SENSITIVITY_X15 = "sensitivity x1.5"
FLOAT_ADDITION = "float addition"
#: Relative slack on "exceeds": a bound equal to the claim up to rounding is within it.
_SLACK = 1e-9


@dataclass(frozen=True)
class Test:
    """A distinguisher: its name (``"likelihood ratio"``, ``"precision"``, ...), what it does, its
    statistic, and how its threshold is chosen on the calibration runs: ``"search"`` (the candidate with the
    best bound: right for a tail event, a perfect test, a Laplace edge) or ``"balanced"`` (where FPR = FNR:
    the Gaussian trade-off curve is measured most sharply there, and a search among candidates that all
    bound mu about equally would pick the calibration runs' noise)."""

    name: str
    description: str
    scores: Scores
    threshold: Literal["search", "balanced"] = "search"


@dataclass(frozen=True)
class Mechanism:
    """An audit target: what it claims, and its tests. ``control``: None for the mechanism as pobo ships it,
    else the label of the error planted in it (the audit must catch it)."""

    name: str
    claim: Claim
    formal_guarantee: bool
    tests: tuple[Test, ...]
    control: str | None = None
    #: Runs per dataset when the caller does not set them: enough for this mechanism's tests to be decisive.
    default_trials: int = 20_000

    @property
    def claimed_epsilon(self) -> float:
        return self.claim.epsilon

    @property
    def delta(self) -> float:
        return self.claim.delta


#: name -> a factory of (the mechanism, then its controls)
Registry = Mapping[str, Callable[[], Sequence[Mechanism]]]


@dataclass(frozen=True)
class AuditResult:
    mechanism: str
    control: str | None  # None: the mechanism as shipped; else the planted error (e.g. "sensitivity x1.5")
    test: str  # the distinguisher's name
    claim: str  # the claim, in words
    claimed_epsilon: float
    delta: float
    claimed_level: float
    level_name: str  # "mu" or "epsilon"
    trials: int  # runs per dataset (D and D' each), after the calibration runs
    empirical_epsilon_lower_bound: float
    level_lower_bound: float
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
    def exceeds_claim(self) -> bool:
        return self.level_lower_bound > self.claimed_level * (1 + _SLACK) or (
            self.empirical_epsilon_lower_bound > self.claimed_epsilon * (1 + _SLACK)
        )

    @property
    def within_claim(self) -> bool:
        return not self.exceeds_claim

    @property
    def caught(self) -> bool | None:
        """For a control: whether the audit refuted its claim (it must). None for a mechanism."""
        return None if self.control is None else self.exceeds_claim

    @property
    def failed(self) -> bool:
        """A mechanism with a guarantee that exceeds it, or a control the audit did not catch."""
        if self.control is not None:
            return not self.exceeds_claim
        return self.formal_guarantee and self.exceeds_claim

    def row(self) -> dict[str, object]:
        return asdict(self) | {"within_claim": self.within_claim, "caught": self.caught}


def _bounds(claim: Claim, fp: int, fn: int, trials: int, alpha: float) -> tuple[float, float, float, float]:
    return _bounds_unequal(claim, fp, trials, fn, trials, alpha)


def _bounds_unequal(
    claim: Claim, fp: int, n0: int, fn: int, n1: int, alpha: float
) -> tuple[float, float, float, float]:
    fpr_u = clopper_pearson_upper(fp, n0, alpha / 2)
    fnr_u = clopper_pearson_upper(fn, n1, alpha / 2)
    return (
        claim.level_lower_bound(fpr_u, fnr_u),
        epsilon_lower_bound(fpr_u, fnr_u, 0.0 if claim.kind == "pure" else claim.delta),
        fpr_u,
        fnr_u,
    )


def choose_threshold(
    claim: Claim,
    s0: FloatArray,
    s1: FloatArray,
    *,
    alpha: float,
    candidates: int = 200,
    rule: Literal["search", "balanced"] = "search",
) -> float:
    """The threshold whose error counts on these calibration scores give the highest level bound (ties: the
    higher epsilon bound), with the Clopper-Pearson bounds at the calibration runs' own size: a threshold
    out in a tail, where a few counts decide, is not preferred for a lucky draw.

    Candidates are midpoints between quantiles of the pooled scores (plus the extremes). ``rule="balanced"``
    takes the candidate where the two error rates are closest instead.
    """
    pooled = np.sort(np.concatenate([s0, s1]))
    qs = np.unique(np.quantile(pooled, np.linspace(0.0, 1.0, candidates)))
    cands = np.concatenate([[pooled[0] - 1.0], 0.5 * (qs[1:] + qs[:-1]), [pooled[-1] + 1.0]])
    s0s, s1s = np.sort(s0), np.sort(s1)
    fps = s0s.size - np.searchsorted(s0s, cands, side="right")  # D's runs with s > t
    fns = np.searchsorted(s1s, cands, side="right")  # D''s runs with s <= t
    if rule == "balanced":
        return float(cands[int(np.argmin(np.abs(fps / s0s.size - fns / s1s.size)))])
    best_t, best = float(cands[0]), (-1.0, -1.0)
    for t, fp, fn in zip(cands, fps, fns, strict=True):
        level, eps, _, _ = _bounds_unequal(claim, int(fp), s0s.size, int(fn), s1s.size, alpha)
        if (level, eps) > best:
            best_t, best = float(t), (level, eps)
    return best_t


#: Default 1 - confidence of every bound.
ALPHA = 1e-3


def run_test(
    mechanism: Mechanism,
    test: Test,
    *,
    trials: int | None = None,
    calibration_trials: int | None = None,
    alpha: float = ALPHA,
    rng: np.random.Generator,
) -> AuditResult:
    """Audit ``mechanism`` with one of its tests: calibrate a threshold on fresh runs, count errors on
    ``trials`` more runs on each dataset (None: the mechanism's ``default_trials``)."""
    trials = mechanism.default_trials if trials is None else trials
    if trials < 10:
        raise ValueError(f"trials must be >= 10, got {trials}")
    cal = calibration_trials or max(1000, trials // 5)
    claim = mechanism.claim
    s0, s1 = test.scores(False, cal, rng), test.scores(True, cal, rng)
    t = choose_threshold(claim, s0, s1, alpha=alpha, rule=test.threshold)
    s0 = test.scores(False, trials, rng)
    s1 = test.scores(True, trials, rng)
    fp, fn = int(np.count_nonzero(s0 > t)), int(np.count_nonzero(s1 <= t))
    level, eps, fpr_u, fnr_u = _bounds(claim, fp, fn, trials, alpha)
    return AuditResult(
        mechanism=mechanism.name,
        control=mechanism.control,
        test=test.name,
        claim=claim.describe(),
        claimed_epsilon=claim.epsilon,
        delta=claim.delta,
        claimed_level=claim.level,
        level_name=claim.level_name,
        trials=trials,
        empirical_epsilon_lower_bound=eps,
        level_lower_bound=level,
        formal_guarantee=mechanism.formal_guarantee,
        distinguisher=test.description,
        threshold=t,
        false_positives=fp,
        false_negatives=fn,
        fpr_upper=fpr_u,
        fnr_upper=fnr_u,
        confidence=1.0 - alpha,
        perfect_distinguisher=fp == 0 and fn == 0,
    )


def run_audit(
    mechanism: Mechanism,
    *,
    trials: int | None = None,
    calibration_trials: int | None = None,
    alpha: float = ALPHA,
    rng: np.random.Generator,
) -> list[AuditResult]:
    """Audit ``mechanism`` with each of its tests (one result per test, in order)."""
    return [
        run_test(mechanism, test, trials=trials, calibration_trials=calibration_trials, alpha=alpha, rng=rng)
        for test in mechanism.tests
    ]


def audit_rng(seed: int, *path: int) -> np.random.Generator:
    """The production generator (AES-CTR) keyed from (seed, path): every run of an audit is reproducible."""
    state = np.random.SeedSequence([int(seed), *map(int, path)]).generate_state(2, np.uint64)
    return seeded_rng(int(state[0]) << 64 | int(state[1]))


def run_all(
    names: list[str] | None = None,
    *,
    trials: int | None = None,
    calibration_trials: int | None = None,
    control_trials: int | None = None,
    seed: int = 0,
    alpha: float = ALPHA,
    controls: bool = True,
    progress: Callable[[str], None] | None = None,
    registry: Registry,
) -> list[AuditResult]:
    """Audit the registered mechanisms (all, or ``names``) and, with ``controls``, their controls; each
    mechanism and test with its own seeded stream, every bound at 1 - alpha / (number of rows) so that the
    run as a whole holds at 1 - alpha. ``control_trials``: the runs of a control's rows (None: ``trials``); a
    control's flaw is gross, and a smaller count still catches it where the sound row needs every run to
    show that its bound comes close to the claim. ``registry``: ``pobo audit privacy`` merges the
    registries of ``shared.privacy``, ``shared.bo.gibo`` and ``shared.federated`` (``shared.privacy`` may
    import neither)."""
    unknown = sorted(set(names or []) - set(registry))
    if unknown:
        raise ValueError(f"unknown mechanism(s) {unknown}: choose from {sorted(registry)}")
    plan = [
        (k, j, i, mechanism, test)
        for k, name in enumerate(names or list(registry))
        for j, mechanism in enumerate(registry[name]())
        if mechanism.control is None or controls
        for i, test in enumerate(mechanism.tests)
    ]
    # Bonferroni: every row's bound at 1 - alpha / rows, so the whole run is right with probability
    # >= 1 - alpha (a sound mechanism is reported over its claim by chance in at most alpha of runs)
    per_row = alpha / max(1, len(plan))
    results: list[AuditResult] = []
    for k, j, i, mechanism, test in plan:
        if progress:
            label = mechanism.name + (f" [{mechanism.control}]" if mechanism.control else "")
            progress(f"{label}: {test.name}")
        results.append(
            run_test(
                mechanism,
                test,
                trials=trials if mechanism.control is None or control_trials is None else control_trials,
                calibration_trials=calibration_trials,
                alpha=per_row,
                rng=audit_rng(seed, k, j, i),
            )
        )
    return results
