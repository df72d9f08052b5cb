"""``pobo bench strategies``: does every strategy learn at its defaults? (issue 32)

Every registered strategy that chooses rows runs at its **default** parameters (a study gives only what has
no default: ``B`` and ``v`` of the heavy-tailed strategies; the LDP strategies' ``epsilon``, ``B`` and ``R``
are the grant's) through the round interface the modeler uses (``initial_state`` / ``plan`` / ``observe``),
on three problems, each an input-private release, with and without output privacy:

* ``synthetic`` -- the PO-GP-UCB paper's synthetic setting (``shared.tools.bench.synthetic``): a 100 x 100
  grid (n = 10 000, d = 2, the paper's scale), f ~ GP(SE) standardised; declared B = 4, R = 1.
* ``diabetes`` -- scikit-learn's diabetes data (n = 442 patients, d = 10 measurements, raw units); each
  feature declared at 1 % of its range (a simulation's stand-in for a curator's domain units); the outcome is
  the disease-progression score, uploaded relative to the midpoint 175 of its declared range [0, 350]
  (so that CTL's symmetric clip fits it): B = 175, R = 10.
* ``demo-hospital`` -- pobo's bundled demo cohort (n = 4000, d = 7, the demo's declared clinical units);
  the recovery score relative to the midpoint of its range [0, 100]: B = 50, R = 1.

The release is the default Gaussian mechanism at epsilon_in = 1, delta = 1e-5 (no projection); a query's
outcome is f(row) + eta, eta ~ U[-R, R]. Output modes: ``plain`` (the outcome as measured) and ``ctl`` (the
curator's CTL at epsilon_out = 4: clipped to [-(B + R), B + R] plus Laplace of scale 2 (B + R) / epsilon_out,
simulated with a seeded generator like ``shared.tools.bench.ldp_problems``). Strategies: ``gp-ucb``,
``gp-bucb`` and ``random`` in both modes; ``tgp-ucb``, ``ata-gp-ucb``, ``moma-gp-ucb`` in ``plain`` (v = B^2
+ R^2 / 3, MoMA's c = R^2 / 3, alpha = 1); ``ldp-tgp-ucb``, ``ldp-ata-gp-ucb``, ``ldp-moma-gp-ucb`` in
``ctl``. A study has T = 200 plays, except on ``diabetes``, where T = 100: its 442 rows cap what a strategy
that never plays a row twice can reach (the 200 best rows average 0.63 of random play's regret, the 100 best
0.42). Metric: the **regret ratio**, the mean regret of the rows played, (1/T) sum_t (max f -
f(x_t)), over that of uniform random play, mean(max f - f) (1 = no learning; random is 1 in expectation).
Paired design: in one run every strategy of a problem sees the same release, f and noise sequence.

How the defaults were chosen (written down before any result was seen; ``--tune`` runs it). For each
parameter below, every candidate runs on tuning runs (seed + 1000: disjoint from the report's), on the
three problems and the modes the strategies run in; the candidate chosen is the one with the smallest
**worst case** over (strategy, problem, mode) of the mean regret ratio; a candidate closer to the theorem
(a larger beta) within 0.02 of that worst case is preferred.

* the six heavy-tailed / LDP strategies' ``beta_multiplier`` (one family default): {1, 0.3, 0.1, 0.03,
  0.01} (round 2: and 0.003, 0.001);
* MoMA-GP-UCB's ``k`` (both variants), with the family's beta chosen above: {5, 9, 15, 25};
* GP-UCB's and GP-BUCB's ``beta_scale`` (one default for both; a factor on GP-UCB's beta_t, 1 = Srinivas et
  al.'s): {1, 0.3, 0.1, 0.03, 0.01} (round 2: and 0.003, 0.001). (GP-BUCB's own ``beta_multiplier``,
  exp(2C) >= 1, stays 1.)

Round 2 (issue 32; written down before any of its results was seen). The first round's GP-UCB fit was
degenerate: each maximum-likelihood refit started from the last one, which started from absolute values,
and the chain stayed on the ridge where every row's variance is signal (``shared.bo.mle``), so the posterior
mean carried little and ``beta_scale`` could not matter (its worst case was flat, 0.87-0.89). With the fit
repaired (every refit from the observations' own scale, an even signal/noise start, the grant's output noise
as the noise's floor), the rule is run again, unchanged, on both grids extended by the same steps below
their edge (the family's best, 0.01, was at the edge with its worst case still falling): 0.003 and 0.001
join both grids. The grids stop there: what the rule picks on them is the default.

Round 3 (issue 32; written down before any of its results was seen). Rounds 1 and 2 drew a fresh
measurement noise for every play and, under CTL, fresh Laplace noise for every play, so a strategy that plays
a row again (TGP, ATA, MoMA and their LDP variants) got a fresh noisy answer each time. The service does not
answer so: a row has one stored outcome (the curator's table, or the lab's one measurement) and a repeated
query returns it; under output privacy the default grant (``fresh_repeats`` false) returns the row's cached
noisy answer, and a grant with ``fresh_repeats`` adds fresh Laplace noise to the same stored outcome, up to
its per-person cap. Round 3 makes the bench answer as the service does (``ServiceProblem``): each row's
measurement noise is drawn once per run; ``ctl`` is the default grant (a row's first answer is cached) for
every strategy that asks one answer per choice, and a grant with ``fresh_repeats`` and ``max_epsilon_per_row``
= k x epsilon for MoMA-GP-UCB, whose epochs need k fresh answers of a row (the least cap that admits its k;
the modeler then limits its plays of a row to k, ``max_plays_per_row``); MoMA in ``plain`` gets the row's
stored outcome k times, as the service answers it. The rule is then run again, unchanged, on round 2's
grids. The report also shows a **reference** that is neither a strategy nor part of the rule: a model that
never plays a row twice and knows the noise's variance (``shared.tools.bench.reference``), to show what
a no-replay strategy can reach on each problem.

Round 4 (issue 32; written down after round 3's tuning runs and before any result of round 4 was seen).
Round 3's tuning runs showed the strategies that play a row again (TGP, ATA and their LDP variants) chasing
their own noise: under the service's answers a repeat returns the row's stored or cached answer, which these
algorithms count as a new independent observation (their analyses assume fresh noise on every play), so a
row whose one answer came out high is played again and again. Round 4 changes the product, not a number: a
strategy plays a row again only when the grant answers a repeat with fresh noise (``fresh_repeats``); under
any other grant the heavy-tailed and LDP strategies never choose a row already played (MoMA: a row played in
an earlier epoch), as GP-UCB already does (``exclude_queried``, filled from the grant by the modeler and
recorded). The rule is then run again, unchanged, on round 2's grids, and its picks are the defaults.

``dp-gibo`` (``--gibo``): its defaults on a real-data logistic regression, scikit-learn's breast-cancer data
(the first 9 features centred, declared at their standard deviations, plus an intercept: 10 parameters, all
569 patients), a gradient oracle with the box [-5, 5]^10, clip B = 1, mu = 2, T = 30 steps, delta = 1e-5,
run through the curator's ``oracle_gradient``; the score is the fraction of the gap between the start's
training loss and the box's optimum (L-BFGS-B) that the last iterate closes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from shared.bo.strategies import get_strategy, parse_params
from shared.tools.bench.defaults_gibo import run_gibo
from shared.tools.bench.defaults_problems import (
    DECLARED,
    DELTA_INPUT,
    EPSILON_INPUT,
    PROBLEMS,
    T_DEFAULT,
    T_OF_PROBLEM,
    ServiceProblem,
    make_problem,
    random_ratio_denominator,
)
from shared.tools.bench.ldp import Case, study
from shared.tools.bench.ldp_problems import Problem
from shared.tools.bench.pool import map_runs
from shared.tools.bench.reference import reference_ratio
from shared.tools.bench.report import bench_main, markdown_table, rich_table

MODES = ("plain", "ctl")
EPSILON_OUTPUT = 4.0
TUNING_SEED_OFFSET = 1000

BOTH = ("gp-ucb", "gp-bucb", "random")
#: Not a strategy: the no-replay yardstick of ``shared.tools.bench.reference`` (round 3).
REFERENCE = "reference"
PLAIN_ONLY = ("tgp-ucb", "ata-gp-ucb", "moma-gp-ucb")
CTL_ONLY = ("ldp-tgp-ucb", "ldp-ata-gp-ucb", "ldp-moma-gp-ucb")
HEAVY_TAILED = PLAIN_ONLY + CTL_ONLY

BETA_GRID = (1.0, 0.3, 0.1, 0.03, 0.01, 0.003, 0.001)  # 0.003, 0.001: round 2
K_GRID = (5, 9, 15, 25)
#: Within this of the best worst case, the candidate closer to the theorem is preferred.
TIE = 0.02
#: GP-UCB's and GP-BUCB's beta_scale candidates.
GP_BETA_GRID = (1.0, 0.3, 0.1, 0.03, 0.01, 0.003, 0.001)  # 0.003, 0.001: round 2


# ------------------------------------------------------------------------------------------------ cases


@dataclass(frozen=True)
class Entry:
    """One strategy in one output mode, with the parameters that differ from its defaults (tuning only)."""

    strategy: str
    mode: str
    overrides: tuple[tuple[str, float], ...] = ()

    @property
    def label(self) -> str:
        extra = ", ".join(f"{k}={v:g}" for k, v in self.overrides)
        return f"{self.strategy}[{extra}]" if extra else self.strategy


def default_entries(*, reference: bool = True) -> list[Entry]:
    """Every row-choosing strategy at its defaults, in the modes it runs in (and the reference, round 3)."""
    entries = [Entry(s, m) for m in MODES for s in BOTH]
    entries += [Entry(s, "plain") for s in PLAIN_ONLY]
    entries += [Entry(s, "ctl") for s in CTL_ONLY]
    if reference:
        entries += [Entry(REFERENCE, m) for m in MODES]
    return entries


def tuning_entries() -> list[Entry]:
    """The candidates of the rule (module docstring): every beta for the six, every (beta, k) for MoMA, every
    beta_scale for GP-UCB and GP-BUCB."""
    out: list[Entry] = []
    for beta in BETA_GRID:
        for s in HEAVY_TAILED:
            mode = "ctl" if s.startswith("ldp-") else "plain"
            if "moma" in s:
                out += [Entry(s, mode, (("beta_multiplier", beta), ("k", float(k)))) for k in K_GRID]
            else:
                out.append(Entry(s, mode, (("beta_multiplier", beta),)))
    for scale in GP_BETA_GRID:
        out += [Entry(s, m, (("beta_scale", scale),)) for s in ("gp-ucb", "gp-bucb") for m in MODES]
    return out


def study_params(entry: Entry, problem: Problem) -> dict[str, Any]:
    """What a study gives: nothing for defaults, the heavy-tailed bounds, the LDP grant's values."""
    raw: dict[str, Any] = {}
    if entry.strategy in PLAIN_ONLY:
        raw = {"B": problem.B, "v": problem.B**2 + problem.noise_second_moment}
        if "moma" in entry.strategy:
            raw["c"] = problem.noise_second_moment
    elif entry.strategy in CTL_ONLY:  # the grant's values (the modeler fills them from the grant)
        raw = {"epsilon": EPSILON_OUTPUT, "B": problem.B, "R": problem.R}
    for key, value in entry.overrides:
        raw[key] = int(value) if key == "k" else value
    return raw


def one_job(args: tuple[int, int, str, Sequence[Entry], int]) -> dict[Entry, float]:
    """Every entry on one run's problem: the regret ratio of each (paired: one release, f, noise)."""
    seed, run, name, entries, T = args
    problem = make_problem(name, seed, run, T)
    random_play = random_ratio_denominator(problem)
    round_seed = int(np.random.default_rng([seed, run, 11]).integers(2**62))
    out: dict[Entry, float] = {}
    for entry in entries:
        epsilon = EPSILON_OUTPUT if entry.mode == "ctl" else None
        if entry.strategy == REFERENCE:
            out[entry] = reference_ratio(problem, epsilon, state_seed=(seed, run, 5), round_seed=round_seed)
            continue
        raw = study_params(entry, problem)
        answered, raw = grant_for(entry, problem, raw)
        result = study(
            answered,
            Case(name, entry.strategy, epsilon),
            state_seed=(seed, run, 5),
            round_seed=round_seed,
            raw_params=raw,
        )
        out[entry] = float(result.regret[-1] / T / random_play)
    return out


def grant_for(
    entry: Entry, problem: ServiceProblem, raw: dict[str, Any]
) -> tuple[ServiceProblem, dict[str, Any]]:
    """The grant a strategy runs under, and the parameters the modeler fills from it: in ``ctl`` the default
    grant (cached repeats), or, for a strategy that asks for k > 1 fresh answers of a row (MoMA),
    ``fresh_repeats`` with a cap of k answers per person, so ``max_plays_per_row`` = k (round 3,
    ``modeler_service.grants.fit_to_grant``); and whether a row may be played again (round 4,
    ``Strategy.with_answers``: only when repeats are fresh)."""
    cls = get_strategy(entry.strategy)
    params = parse_params(entry.strategy, raw)
    k = cls.fresh_plays_per_row(params, budget=problem.T)
    fresh = entry.mode == "ctl" and k > 1
    exclude = cls.with_answers(params, fresh_repeats=fresh).model_dump().get("exclude_queried")
    if exclude is not None:
        raw = raw | {"exclude_queried": exclude}
    if fresh:
        return replace(problem, fresh_repeats=True), raw | {"max_plays_per_row": k}
    return problem, raw


def run_benchmark(
    runs: int,
    *,
    T: int = T_DEFAULT,
    problems: Sequence[str] = PROBLEMS,
    entries: Sequence[Entry] | None = None,
    seed: int = 0,
    workers: int = 2,
    progress: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Mean and standard error over ``runs`` of every entry's regret ratio on every problem."""
    todo = list(entries) if entries is not None else default_entries()
    jobs = [(seed, run, p, todo, T_OF_PROBLEM.get(p, T)) for run in range(runs) for p in problems]
    ratios: dict[tuple[str, Entry], list[float]] = {}
    for (_, _, name, _, _), res in zip(jobs, map_runs(one_job, jobs, workers), strict=True):
        for entry, ratio in res.items():
            ratios.setdefault((name, entry), []).append(ratio)
        if progress:
            progress()
    results = []
    for (name, entry), values in ratios.items():
        v = np.asarray(values)
        results.append(
            {
                "problem": name,
                "strategy": entry.strategy,
                "label": entry.label,
                "mode": entry.mode,
                "overrides": dict(entry.overrides),
                "runs": int(v.size),
                "ratio_mean": float(v.mean()),
                "ratio_se": float(v.std(ddof=1) / math.sqrt(v.size)) if v.size > 1 else 0.0,
                "ratios": v.tolist(),
            }
        )
    return {
        "config": {
            "runs": runs,
            "seed": seed,
            "T": {p: T_OF_PROBLEM.get(p, T) for p in problems},
            "problems": list(problems),
            "epsilon_input": EPSILON_INPUT,
            "delta_input": DELTA_INPUT,
            "epsilon_output": EPSILON_OUTPUT,
            "declared": {p: {"B": DECLARED[p].B, "R": DECLARED[p].R} for p in problems},
        },
        "results": results,
    }


# -------------------------------------------------------------------------------------------------- rule


def _worst(results: Sequence[dict[str, Any]], keep: Callable[[dict[str, Any]], bool]) -> float:
    return max(float(r["ratio_mean"]) for r in results if keep(r))


def choose(candidates: Sequence[float], worst: Callable[[float], float]) -> tuple[float, dict[float, float]]:
    """The rule: the smallest worst case, preferring the candidate listed first (closer to the theorem)
    within ``TIE`` of it. ``candidates`` are in order of preference (the theorem's first)."""
    table = {c: worst(c) for c in candidates}
    best = min(table.values())
    return next(c for c in candidates if table[c] <= best + TIE), table


def apply_rule(report: dict[str, Any]) -> dict[str, Any]:
    """The defaults the rule picks from a tuning report (``tuning_entries``)."""
    results = report["results"]

    def at(r: dict[str, Any], strategy_kind: str, beta: float, k: float | None = None) -> bool:
        o = r["overrides"]
        if r["strategy"] not in HEAVY_TAILED or o.get("beta_multiplier") != beta:
            return False
        moma = "moma" in r["strategy"]
        return (not moma) if strategy_kind == "other" else (moma and (k is None or o.get("k") == k))

    def six(beta: float) -> float:
        # MoMA counts with its best k at this beta (k is chosen next, given beta)
        others = _worst(results, lambda r: at(r, "other", beta))

        def moma_at(k: float) -> float:
            return _worst(results, lambda r: at(r, "moma", beta, k))

        return max(others, min(moma_at(float(k)) for k in K_GRID))

    beta, beta_table = choose(BETA_GRID, six)

    def moma_k(k: float) -> float:
        return _worst(results, lambda r: at(r, "moma", beta, k))

    k, k_table = choose([float(k) for k in K_GRID], moma_k)

    def gp(scale: float) -> float:
        return _worst(
            results,
            lambda r: r["strategy"] in ("gp-ucb", "gp-bucb") and r["overrides"].get("beta_scale") == scale,
        )

    gp_scale, gp_table = choose(GP_BETA_GRID, gp)
    return {
        "beta_multiplier": beta,
        "beta_worst_case": beta_table,
        "moma_k": int(k),
        "moma_k_worst_case": {int(c): w for c, w in k_table.items()},
        "gp_beta_scale": gp_scale,
        "gp_beta_scale_worst_case": gp_table,
    }


# ------------------------------------------------------------------------------------------------ report

HEADER = ["problem", "output privacy", "strategy", "regret / random", "runs"]


def summary_rows(report: dict[str, Any]) -> list[list[str]]:
    rows = []
    for r in sorted(report["results"], key=lambda r: (PROBLEMS.index(r["problem"]), r["mode"], r["label"])):
        mode = f"CTL, eps {report['config']['epsilon_output']:g}" if r["mode"] == "ctl" else "-"
        rows.append(
            [r["problem"], mode, r["label"], f"{r['ratio_mean']:.2f} ± {r['ratio_se']:.2f}", str(r["runs"])]
        )
    return rows


def markdown(report: dict[str, Any]) -> str:
    text = markdown_table(
        "Regret of the rows played over random play's, at the defaults", HEADER, summary_rows(report)
    )
    if "rule" in report:
        text += "\n" + "\n".join(f"- {k}: {v}" for k, v in report["rule"].items()) + "\n"
    if "gibo" in report:
        g = report["gibo"]
        text += (
            f"\ndp-gibo (breast cancer, 10 parameters, mu {g['mu']:g}, {g['steps']} steps): closes "
            f"{g['closed_mean']:.2f} ± {g['closed_se']:.2f} of the gap (loss {g['start']:.4f} -> "
            f"{g['final_mean']:.4f}, optimum {g['optimum']:.4f}; {g['runs']} runs)\n"
        )
    return text


def main(
    *,
    runs: int,
    T: int,
    problems: Sequence[str],
    seed: int,
    workers: int,
    tune: bool,
    gibo: bool,
    json_path: Path | None,
) -> dict[str, Any]:
    entries = tuning_entries() if tune else default_entries()
    run_seed = seed + TUNING_SEED_OFFSET if tune else seed
    what = "tuning candidates" if tune else "defaults"

    def complete(report: dict[str, Any]) -> None:
        report["config"]["tuning"] = tune
        if tune:
            report["rule"] = apply_rule(report)
        if gibo:
            report["gibo"] = run_gibo(runs, seed=run_seed, workers=workers)

    return bench_main(
        lambda advance: run_benchmark(
            runs, T=T, problems=problems, entries=entries, seed=run_seed, workers=workers, progress=advance
        ),
        label=f"strategies at their {what} ({len(problems)} problems x {runs})",
        runs=runs * len(problems),
        complete=complete,
        show=_shown,
        json_path=json_path,
        markdown=markdown,
    )


def _shown(report: dict[str, Any]) -> list[Any]:
    """The table, then the rule's picks (``--tune``) and dp-gibo's gap closed (if run)."""
    shown: list[Any] = [
        rich_table(
            "regret of the rows played / random play's",
            HEADER,
            summary_rows(report),
            left={"problem", "output privacy", "strategy"},
        )
    ]
    if "rule" in report:
        shown += [f"{key}: {value}" for key, value in report["rule"].items()]
    if "gibo" in report:
        g = report["gibo"]
        shown.append(
            f"dp-gibo closes {g['closed_mean']:.2f} ± {g['closed_se']:.2f} of its gap ({g['runs']} runs)"
        )
    return shown
