"""``pobo bench ldp``: the LDP-BO paper's synthetic experiments, and output privacy on top of input privacy.

Zhou & Tan, "Local Differential Privacy for Bayesian Optimization" (AAAI 2021), Section 5 and Appendix E:
cumulative regret R_t = sum_{s <= t} (max f - f(x_s)) vs t, T = 1000, of the registry strategies (the
modeler's ``shared.bo.strategies``, run through their round interface ``initial_state`` / ``plan`` /
``observe`` exactly as the service runs them):

- ``se``, ``matern``: LDP-TGP-UCB, LDP-ATA-GP-UCB, LDP-MoMA-GP-UCB on the 100-arm synthetic function, noise
  U[-1, 1] (R = 1), answers privatised by CTL(eps) at eps = 1 and 0.5 (Fig. 2a: Matern, eps = 1; Fig. 3a: SE,
  eps = 1);
- ``student-t``: the non-private TGP-UCB, ATA-GP-UCB, MoMA-GP-UCB under Student-t(3) noise, SE kernel, no
  privatisation (Fig. 2d); moment bound of order 1 + alpha = 2 (alpha = 1): v = B^2 + 3 since
  E[y^2] = f(x)^2 + E[eta^2] <= B^2 + 3 (the paper's choice; c = 3 for the noise alone);
- ``combined``: input privacy and output privacy together, on pobo's own synthetic problem
  (``shared.tools.bench.synthetic``: 100 x 100 grid, f ~ GP standardised): the rows are the Gaussian
  release at eps_in = 1 (delta = 1e-5), the outcomes f + U[-1, 1] go through CTL(eps_out), eps_out in {0.5,
  1, 2, 4}, beside eps_out = inf (no output noise: plain ``gp-ucb`` with the transfer hyper-parameters). T =
  200 by default (``--combined-T``; n = 10 000 candidates per step). B = 4 (units of sigma_y) is *declared
  from f's scale*: this is a simulation; a real curator declares B from domain knowledge, never from the data.

The paper's B = max |f| (``se``/``matern``/``student-t``) is likewise a simulation's privilege.

MoMA-GP-UCB's k: the paper's k = ceil(24 ln(4 e T / delta)) is the default (295 at T = 1000, delta = 0.05:
only 3 epochs); a practical sweep k in {5, 9, 15, 25} runs beside it as separate entries
(``"ldp-moma-gp-ucb[k=9]"``, with a ``"k"`` field). A k larger than the study's T cannot run (MoMA refuses
it; the paper's k is 257 at the combined setting's T = 200): such cases are listed under ``"skipped"``.

Strategy parameters are the theorems' (``beta_multiplier`` 1, lambda 1, delta 0.05, the kernel and lengthscale
of f itself); ``--beta-multiplier`` scales every beta of the six strategies. The table compares R_T with the
expected cumulative regret of uniform random play, T mean(max f - f) (``random_regret_per_step``).

CTL noise is simulated with a seeded numpy generator (``shared.tools.bench.ldp_problems``): clip, then
Laplace of scale 2 (B + R) / eps, exactly like ``shared.privacy.ctl.CTL``; production answers use OpenDP's
sampler seeded by the OS (seeds exist in benchmarks only). Paired design: each run draws one f per setting
(se, matern and student-t share w and s) and one noise sequence, used by every strategy and epsilon of that
run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shared.bo.strategies import Answer, get_strategy, parse_params, round_rng
from shared.privacy.ctl import CTL
from shared.tools.bench.ldp_problems import EPSILON_INPUT, Problem, make_problem, moma_paper_k
from shared.tools.bench.pool import map_runs
from shared.tools.bench.report import bench_main, markdown_table, rich_table, save_figure
from shared.tools.bench.synthetic import DELTA as SYNTHETIC_DELTA

SETTINGS = ("se", "matern", "student-t", "combined")
LDP_STRATEGIES = ("ldp-tgp-ucb", "ldp-ata-gp-ucb", "ldp-moma-gp-ucb")
HEAVY_TAILED_STRATEGIES = ("tgp-ucb", "ata-gp-ucb", "moma-gp-ucb")
PAPER_EPSILONS = (1.0, 0.5)
COMBINED_EPSILONS = (0.5, 1.0, 2.0, 4.0)
K_SWEEP = (5, 9, 15, 25)
T_DEFAULT = 1000
COMBINED_T_DEFAULT = 200
DELTA = 0.05  # the strategies' confidence parameter (their default)


@dataclass(frozen=True)
class Case:
    """One curve: a registry strategy on a setting at an output epsilon (None: no CTL), MoMA's k (None: the
    strategy's default, the paper's formula)."""

    setting: str
    strategy: str
    epsilon: float | None
    k: int | None = None
    beta_multiplier: float = 1.0  # the six strategies' factor on the theorem's beta

    @property
    def label(self) -> str:
        return self.strategy if self.k is None else f"{self.strategy}[k={self.k}]"


def cases(
    settings: Sequence[str],
    *,
    private: Sequence[str] = LDP_STRATEGIES,
    heavy_tailed: Sequence[str] = HEAVY_TAILED_STRATEGIES,
    k_sweep: Sequence[int] = K_SWEEP,
    baseline: str | None = "gp-ucb",
    beta_multiplier: float = 1.0,
) -> list[Case]:
    """Every (setting, strategy, eps, k) to run; the k sweep for the strategies whose name has "moma"."""

    def with_sweep(setting: str, names: Sequence[str], eps: float | None) -> list[Case]:
        out = [Case(setting, name, eps, None, beta_multiplier) for name in names]
        out += [Case(setting, n, eps, k, beta_multiplier) for n in names if "moma" in n for k in k_sweep]
        return out

    todo: list[Case] = []
    for s in settings:
        if s in ("se", "matern"):
            for eps in PAPER_EPSILONS:
                todo += with_sweep(s, private, eps)
        elif s == "student-t":
            todo += with_sweep(s, heavy_tailed, None)
        elif s == "combined":
            for eps in COMBINED_EPSILONS:
                todo += with_sweep(s, private, eps)
            if baseline:
                todo.append(Case(s, baseline, None))
        else:
            raise ValueError(f"unknown setting {s!r}; the settings are {', '.join(SETTINGS)}")
    return todo


def strategy_params(case: Case, problem: Problem) -> dict[str, Any]:
    """The study's ``strategy_params`` for a case (LDP: eps, B, R; heavy-tailed: B, v, alpha; kernel)."""
    name = case.strategy
    model = {"kernel": problem.kernel, "lengthscale": float(problem.lengthscale)}
    if name in ("gp-ucb", "gp-bucb"):  # SE only; noise variance of the answers (Laplace: 2 b^2)
        noise = problem.noise_second_moment
        if case.epsilon is not None and problem.R is not None:
            noise += CTL(epsilon=case.epsilon, B=problem.B, R=problem.R).noise_variance
        signal = 1.0 if problem.setting == "combined" else (problem.B / 3.0) ** 2
        hp = {"lengthscale": model["lengthscale"], "signal_variance": signal, "noise_variance": noise}
        return {"hyperparameters": hp, "exclude_queried": False}
    if name == "random":
        return {}
    raw: dict[str, Any]
    if case.epsilon is not None:
        raw = {"epsilon": float(case.epsilon), "B": float(problem.B), "R": float(problem.R or 0.0), **model}
    else:
        raw = {"B": float(problem.B), "v": float(problem.B**2 + problem.noise_second_moment), "alpha": 1.0}
        raw.update(model)
    if case.epsilon is None and "c" in get_strategy(name).Params.model_fields:
        raw["c"] = float(problem.noise_second_moment)  # MoMA: bound on E|eta|^2 (the paper's c = 3)
    if case.k is not None:
        raw["k"] = int(case.k)
    if case.beta_multiplier != 1.0:
        raw["beta_multiplier"] = float(case.beta_multiplier)
    return raw


@dataclass(frozen=True)
class StudyResult:
    regret: np.ndarray  # [T] cumulative regret
    seconds: float
    first_round: int  # requests in the first round
    rounds: int
    plays_per_row: int | None  # the strategy's own ``fresh_plays_per_row`` (MoMA: its k), if it has one


def study(
    problem: Problem,
    case: Case,
    *,
    state_seed: Sequence[int],
    round_seed: int,
    raw_params: dict[str, Any] | None = None,
) -> StudyResult:
    """One study of T queries through the registry interface; cumulative regret after each query.
    ``raw_params``: the study's ``strategy_params`` (default: ``strategy_params(case, problem)``)."""
    started = time.perf_counter()
    cls = get_strategy(case.strategy)
    raw = strategy_params(case, problem) if raw_params is None else raw_params
    params = parse_params(case.strategy, raw)
    if case.epsilon is not None and problem.R is not None:  # what the modeler completes from the grant
        params = cls.with_output_privacy(params, epsilon=float(case.epsilon), B=problem.B, R=problem.R)
    T, n = problem.T, int(problem.Z.shape[0])
    state = cls.initial_state(params, n=n, budget=T, rng=np.random.default_rng(list(state_seed)))
    strategy = cls(problem.Z, params, state)
    rows = np.empty(T, dtype=np.int64)
    t = rounds = first = 0
    while t < T:
        requests = strategy.plan(budget=T - t, rng=round_rng(round_seed, rounds))
        if not 1 <= len(requests) <= T - t:
            raise RuntimeError(f"{case.strategy} planned {len(requests)} requests with {T - t} left")
        idx = np.fromiter((r.index for r in requests), dtype=np.int64, count=len(requests))
        y = problem.outcomes(idx, np.arange(t, t + idx.size), case.epsilon)
        strategy.observe([Answer(r, float(v)) for r, v in zip(requests, y, strict=True)])
        rows[t : t + idx.size] = idx
        first = first or int(idx.size)
        t += idx.size
        rounds += 1
    gaps = problem.f.max() - problem.f
    plays = getattr(cls, "fresh_plays_per_row", None)
    k = int(plays(params, budget=T)) if plays is not None else None
    return StudyResult(np.cumsum(gaps[rows]), time.perf_counter() - started, first, rounds, k)


def one_job(args: tuple[int, int, str, Sequence[Case], int]) -> dict[Case, StudyResult]:
    """Every case of one setting on one run's problem (one f, one noise sequence: paired)."""
    seed, run, setting, todo, T = args
    problem = make_problem(setting, seed, run, T)
    round_seed = int(np.random.default_rng([seed, run, 11]).integers(2**62))
    return {
        c: study(problem, c, state_seed=(seed, run, 5), round_seed=round_seed)
        for c in todo
        if c.setting == setting
    }


def _problem_facts(setting: str, seed: int, runs: int) -> dict[str, Any]:
    """B, R, n and the expected regret per step of uniform random play, mean(max f - f), over the runs."""
    p = [make_problem(setting, seed, r, 1) for r in range(runs)]
    return {
        "B_mean": float(np.mean([q.B for q in p])),
        "R": p[0].R,
        "n": int(p[0].Z.shape[0]),
        "random_regret_per_step": float(np.mean([np.mean(q.f.max() - q.f) for q in p])),
    }


def run_benchmark(
    runs: int,
    *,
    T: int = T_DEFAULT,
    combined_T: int = COMBINED_T_DEFAULT,
    settings: Sequence[str] = SETTINGS,
    seed: int = 0,
    workers: int = 2,
    progress: Callable[[], None] | None = None,
    todo: Sequence[Case] | None = None,
) -> dict[str, Any]:
    """Cumulative regret (mean and s.e. over runs) of every case; one job per (setting, run)."""
    horizon = {s: (combined_T if s == "combined" else T) for s in settings}
    chosen: list[Case] = []
    skipped: list[Case] = []
    for c in todo if todo is not None else cases(settings):
        # MoMA refuses k > T; the paper's k does not fit a short study (257 at T = 200: zero epochs).
        plays = (
            c.k
            if c.k is not None
            else (moma_paper_k(horizon[c.setting], DELTA) if "moma" in c.strategy else 1)
        )
        (chosen if plays <= horizon[c.setting] else skipped).append(c)
    todo = chosen
    for name in dict.fromkeys(c.strategy for c in todo):
        get_strategy(name)  # InputDataError listing the registry
    order = sorted(settings, key=lambda s: s != "combined")  # the slowest first
    jobs = [(seed, run, s, todo, horizon[s]) for run in range(runs) for s in order]
    curves: dict[Case, list[StudyResult]] = {c: [] for c in todo}

    def collect(res: dict[Case, StudyResult]) -> None:
        for c, r in res.items():
            curves[c].append(r)
        if progress:
            progress()

    for res in map_runs(one_job, jobs, workers):
        collect(res)
    results = []
    for c in todo:
        C = np.vstack([r.regret for r in curves[c]])
        steps = C.shape[1]
        se = C.std(0, ddof=1) / math.sqrt(C.shape[0]) if C.shape[0] > 1 else np.zeros(steps)
        own_k = {r.plays_per_row for r in curves[c]}
        k = c.k
        if k is None and "moma" in c.strategy:  # the strategy's own k if it says, else the paper's formula
            own = next(iter(own_k)) if len(own_k) == 1 else None
            k = own if own is not None else moma_paper_k(steps, DELTA)
        results.append(
            {
                "strategy": c.label,
                "registry_name": c.strategy,
                "setting": c.setting,
                "epsilon": c.epsilon,
                "runs": int(C.shape[0]),
                "T": steps,
                "k": k,
                "beta_multiplier": c.beta_multiplier,
                "k_source": None if k is None else ("sweep" if c.k is not None else "paper formula"),
                "plays_per_row": own_k.pop() if len(own_k) == 1 else sorted(own_k, key=str),
                "first_round_requests": int(np.median([r.first_round for r in curves[c]])),
                "rounds_mean": float(np.mean([r.rounds for r in curves[c]])),
                "seconds_mean": float(np.mean([r.seconds for r in curves[c]])),
                "output_privacy": c.epsilon is not None and c.setting != "student-t",
                **(
                    {"epsilon_input": EPSILON_INPUT, "delta_input": SYNTHETIC_DELTA}
                    if c.setting == "combined"
                    else {}
                ),
                "cumulative_regret_mean": C.mean(0).tolist(),
                "cumulative_regret_se": se.tolist(),
            }
        )
    return {
        "settings": {
            "runs": runs,
            "T": T,
            "combined_T": combined_T,
            "seed": seed,
            "settings": list(settings),
            "paper_epsilons": list(PAPER_EPSILONS),
            "combined_epsilons": list(COMBINED_EPSILONS),
            "k_sweep": sorted({c.k for c in todo if c.k is not None}),
            "beta_multipliers": sorted({c.beta_multiplier for c in todo}),
            "problems": {s: _problem_facts(s, seed, runs) for s in settings},
            "skipped": [
                {"setting": c.setting, "strategy": c.label, "epsilon": c.epsilon, "reason": "k > T"}
                for c in skipped
            ],
        },
        "results": results,
    }


# ------------------------------------------------------------------------------------------------ report


def summary_rows(report: dict[str, Any]) -> list[list[str]]:
    """setting, eps, strategy, k, R_T mean +- s.e., R_T / T, R_T over uniform random play's expected regret,
    R_T / R_{T/2} (< 2: sub-linear growth), seconds per study."""
    rows = []
    problems = report["settings"]["problems"]
    for item in report["results"]:
        m, se = item["cumulative_regret_mean"], item["cumulative_regret_se"]
        T = len(m)
        random_T = problems[item["setting"]]["random_regret_per_step"] * T
        half = m[T // 2 - 1] if T >= 2 else m[0]
        ratio = m[-1] / half if half > 0 else float("nan")
        eps = "-" if item["epsilon"] is None else f"{item['epsilon']:g}"
        if item["setting"] == "combined" and item["epsilon"] is None:
            eps = "inf"
        rows.append(
            [
                item["setting"],
                eps,
                item["strategy"],
                "-" if item["k"] is None else str(item["k"]),
                f"{m[-1]:.1f} ± {se[-1]:.1f}",
                f"{m[-1] / T:.3f}",
                f"{m[-1] / random_T:.2f}" if random_T > 0 else "-",
                f"{ratio:.2f}",
                f"{item['seconds_mean']:.1f}",
            ]
        )
    return rows


HEADER = [
    "setting",
    "eps",
    "strategy",
    "k",
    "R_T mean ± s.e.",
    "R_T/T",
    "R_T/random",
    "R_T/R_{T/2}",
    "s/study",
]


def summary_table(report: dict[str, Any]) -> Any:
    st = report["settings"]
    title = (
        f"Final cumulative regret R_T over {st['runs']} runs (T = {st['T']}, combined T = "
        f"{st['combined_T']}); R_T/random: over uniform random play's expected R_T; R_T/R_{{T/2}} < 2 means "
        "sub-linear growth"
    )
    return rich_table(title, HEADER, summary_rows(report), left=("setting", "strategy"))


def markdown(report: dict[str, Any]) -> str:
    return markdown_table("LDP-BO synthetic benchmark (cumulative regret)", HEADER, summary_rows(report))


def plot(report: dict[str, Any], path: Path) -> None:
    """One panel per (setting, eps): R_t vs t, mean +- s.e. (k sweep dashed); combined: R_T vs output eps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = report["results"]
    panels = list(dict.fromkeys((i["setting"], i["epsilon"]) for i in res if i["setting"] != "combined"))
    combined = [i for i in res if i["setting"] == "combined"]
    count = len(panels) + (1 if combined else 0)
    cols = min(3, max(count, 1))
    rows_ = math.ceil(max(count, 1) / cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(5.2 * cols, 4.0 * rows_), squeeze=False)
    flat = list(axes.ravel())
    for ax, (setting, eps) in zip(flat, panels, strict=False):
        for item in (i for i in res if (i["setting"], i["epsilon"]) == (setting, eps)):
            m, se = np.array(item["cumulative_regret_mean"]), np.array(item["cumulative_regret_se"])
            t = np.arange(1, m.size + 1)
            swept = item["k_source"] == "sweep"
            ax.plot(t, m, label=item["strategy"], lw=0.9 if swept else 1.8, ls="--" if swept else "-")
            ax.fill_between(t, m - se, m + se, alpha=0.12)
        per_step = report["settings"]["problems"][setting]["random_regret_per_step"]
        steps = np.arange(1, report["settings"]["T"] + 1)
        ax.plot(steps, per_step * steps, color="k", ls=":", lw=1.0, label="uniform random (expected)")
        title = f"{setting}, non-private" if eps is None else f"{setting}, LDP eps = {eps:g}"
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("t")
        ax.set_ylabel("cumulative regret R_t")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    if combined:
        ax = flat[len(panels)]
        for name in dict.fromkeys(i["strategy"] for i in combined if i["epsilon"] is not None):
            items = sorted(
                (i for i in combined if i["strategy"] == name and i["epsilon"] is not None),
                key=lambda i: float(i["epsilon"]),
            )
            x = [i["epsilon"] for i in items]
            y = [i["cumulative_regret_mean"][-1] for i in items]
            e = [i["cumulative_regret_se"][-1] for i in items]
            swept = items[0]["k_source"] == "sweep"
            style = {"lw": 0.9, "ls": "--"} if swept else {"lw": 1.8, "ls": "-"}
            ax.errorbar(x, y, yerr=e, label=name, marker="o", ms=3, capsize=2, **style)
        for i in (i for i in combined if i["epsilon"] is None):
            m, se = i["cumulative_regret_mean"][-1], i["cumulative_regret_se"][-1]
            ax.axhline(m, color="k", lw=1.2, label=f"{i['strategy']} (eps_out = inf)")
            ax.axhspan(m - se, m + se, color="k", alpha=0.08)
        per_step = report["settings"]["problems"]["combined"]["random_regret_per_step"]
        ax.axhline(
            per_step * report["settings"]["combined_T"], color="k", ls=":", lw=1.0, label="uniform random"
        )
        ax.set_xscale("log", base=2)
        ax.set_xlabel("output epsilon (CTL)")
        ax.set_ylabel(f"R_T, T = {report['settings']['combined_T']}")
        ax.set_title("combined: Gaussian release eps_in = 1 + CTL(eps_out)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in flat[count:]:
        ax.axis("off")
    save_figure(fig, path)


def main(
    *,
    runs: int,
    T: int,
    combined_T: int,
    settings: Sequence[str],
    seed: int,
    workers: int,
    json_path: Path | None,
    plot_path: Path | None,
    beta_multiplier: float = 1.0,
) -> dict[str, Any]:
    return bench_main(
        lambda advance: run_benchmark(
            runs,
            T=T,
            combined_T=combined_T,
            settings=settings,
            seed=seed,
            workers=workers,
            progress=advance,
            todo=cases(settings, beta_multiplier=beta_multiplier),
        ),
        label=f"LDP-BO ({len(settings)} settings x {runs})",
        runs=runs * len(settings),
        show=lambda report: [*_skipped_lines(report), summary_table(report)],
        json_path=json_path,
        markdown=markdown,
        plot=plot,
        plot_path=plot_path,
    )


def _skipped_lines(report: dict[str, Any]) -> list[str]:
    """One line per (strategy, setting) left out because its k exceeds the study's T."""
    skipped = dict.fromkeys((i["strategy"], i["setting"]) for i in report["settings"]["skipped"])
    return [f"skipped {label} on {setting}: its k exceeds the study's T" for label, setting in skipped]
