"""``pobo bench gibo``: the DP-GIBO paper's Section 4 examples, end to end through ``shared.bo.gibo``.

Paper: "Scalable Differentially Private Bayesian Optimization" (DP-GIBO), Algorithm 1 (fixed batch b),
Lemma 3.1 (noise 2 B sqrt(T) / (n mu)), Remark 4.1 (AdaGrad), Section 4, App. C. DP-GIBO runs are
``run_dp_gibo``; problems and baselines: ``gibo_problems``. Examples (``EXAMPLES``):

* ``normal-location`` (Section 4.1, Fig. 1, App. C.1): x_i ~ N(1, I_5), n = 50, polynomial kernel (x.y + 1)^2,
  B = 1, b = 3, T = 150, theta0 = 0, gradient descent (learning rate not given in the paper: 0.5). Methods:
  ``dp-gibo`` at mu = 2 and 0.5 and ``gibo`` (mu = inf: the same clipping, no noise). Error:
  ||theta_t - x_bar|| (x_bar the MLE). Also recorded: the estimates, the objective
  f_x(theta_t) = mean 0.5 ||x_i - theta_t||^2 (the average negative log-likelihood up to its constant),
  and Fig. 1 (bottom)'s norms per step --
  ``bias`` = ||clean clipped surrogate average - grad f_x(theta_t)||, its part from the surrogate alone
  ``surrogate_bias`` = ||clean clipped surrogate average - (1/n) sum_i Pi_B(theta_t - x_i)||, and ``noise`` =
  ||released - clean||, recomputed after the run (``private_gradient_diagnostics``, same W and L).
* ``huber-regression`` (Section 4.2, Fig. 2, App. C.2): d = 4, n = 100, B = 1, b = 2, T = 100, theta0 = 0,
  mu = 1, RBF kernel (length-scale not given: 1), gradient descent (learning rate not given: 0.5) for both
  ``dp-gibo`` and ``noisy-gd`` (DP-GD on the exact per-user gradients, same clip, mu, T and step size).
  Error: ||theta_t - theta_hat||, theta_hat the non-private minimiser of the mean loss.
* ``gp-lengthscales`` (Section 4.3, Fig. 4, App. C.3): d = 10 length-scales in [0.05, 5], n = 4500 users
  (validation points), B = 1, b = 11, T = 25, mu = 1, RBF surrogate (length-scale 1), AdaGrad
  (Remark 4.1), theta0 uniform in the box and the same for every method of a run (App. C.3: "random
  restarts inside the optimization area"; it is the first evaluation of both baselines). ``random-search``
  and ``gp-ucb`` (both non-private, as in the paper) get the same number of loss evaluations, T b = 275
  (DP-GIBO's design size; the paper's "265" is not 25 x 11). Choices where the paper is silent:
  AdaGrad step lr = 1 -- the authors' public code uses lr = 1 with AdaGrad (SVR example), and AdaGrad moves
  a coordinate by at most lr sum_t t^-1/2 ~ 8.5 lr in T = 25 steps, so lr = 0.5 (~4.3) could not cross the
  width-5 box from a random start even with every sign right; surrogate length-scale 1 (checked against 0.5
  and 0.25 by the cosine between the clipped surrogate gradient and a finite-difference gradient of f along
  the path: 0.8-0.97 at 1, <= 0.7 at 0.5, ~0 at 0.25); the batch optimisation (``optimize_batch``, L-BFGS-B
  over b d = 110 variables) capped at ``maxiter`` = 100 iterations per step (chosen for the time budget when
  the gradient was by finite differences; kept so that results stay comparable). Error:
  validation loss minus the best validation loss seen in that run by any method (DP-GIBO's iterates and
  design points included). DP-GIBO's path is f(theta_t) after t b evaluations: its output is its iterate
  (Alg. 1 line 10) -- it cannot pick its best design point without spending privacy on the (private) losses,
  and f(theta_t) is a measurement of the benchmark, not an evaluation the algorithm makes. The baselines are
  non-private and see their losses, so their paths are their best value so far (what each would return).
  ``dp_best_iterate`` (an extra, not a private output) is the best f(theta_t) over the path, for reference.

Paired design: within a run every method of an example sees the same data, start, acquisition generator and
standard-normal noise stream (scaled by each mu's sigma). Runs are independent jobs (``map_runs``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from shared.bo.gibo.kernels import GradKernel, PolynomialKernel, SEKernel
from shared.bo.gibo.loop import DPGiboResult, run_dp_gibo
from shared.bo.gibo.losses import gaussian_location, huber_regression
from shared.bo.gibo.updates import AdaGrad, GradientDescent
from shared.tools.bench import gibo_problems as gp
from shared.tools.bench.pool import map_runs
from shared.tools.bench.report import bench_main, markdown_table, rich_table, save_figure

FloatArray = npt.NDArray[np.float64]

EXAMPLES = ("normal-location", "huber-regression", "gp-lengthscales")
_INDEX = {name: k for k, name in enumerate(EXAMPLES)}


@dataclass(frozen=True)
class LocationConfig:
    """Section 4.1 / App. C.1."""

    n: int = 50
    d: int = 5
    T: int = 150
    b: int = 3
    B: float = 1.0
    lr: float = 0.5
    mus: tuple[float, ...] = (2.0, 0.5)
    box: float = 5.0


@dataclass(frozen=True)
class HuberConfig:
    """Section 4.2 / App. C.2."""

    n: int = 100
    d: int = 4
    T: int = 100
    b: int = 2
    B: float = 1.0
    mu: float = 1.0
    lr: float = 0.5
    lengthscale: float = 1.0
    box: float = 5.0


@dataclass(frozen=True)
class TuningConfig:
    """Section 4.3 / App. C.3."""

    d: int = 10
    n_train: int = 500
    n_val: int = 4500
    T: int = 25
    b: int = 11
    B: float = 1.0
    mu: float = 1.0
    lr: float = 1.0
    lengthscale: float = 1.0
    maxiter: int = 100


@dataclass(frozen=True)
class Config:
    location: LocationConfig = field(default_factory=LocationConfig)
    huber: HuberConfig = field(default_factory=HuberConfig)
    tuning: TuningConfig = field(default_factory=TuningConfig)


@dataclass
class MethodRun:
    """One method on one run: error path, x-axis of the path, and named extra paths."""

    method: str
    mu: float | None
    path: FloatArray
    x: FloatArray
    extras: dict[str, FloatArray] = field(default_factory=dict)
    sigma: float = 0.0


def _gibo(
    loss_matrix: Callable[[FloatArray], FloatArray],
    theta0: FloatArray,
    bounds: FloatArray,
    *,
    T: int,
    B: float,
    mu: float,
    b: int,
    kernel: GradKernel,
    updater: GradientDescent | AdaGrad,
    seed: int,
    run: int,
    example: int,
    maxiter: int | None = None,
) -> DPGiboResult:
    """Algorithm 1 with the run's acquisition generator and noise stream (shared by the run's methods)."""
    return run_dp_gibo(
        loss_matrix,
        theta0,
        bounds,
        T=T,
        B=B,
        mu=mu,
        kernel=kernel,
        updater=updater,
        rng=gp.rng_for(seed, run, example, gp.ACQ),
        noise_rng=gp.rng_for(seed, run, example, gp.NOISE),
        batch_size=b,
        maxiter=maxiter,
    )


def run_location(cfg: LocationConfig, seed: int, run: int) -> list[MethodRun]:
    """Section 4.1: gibo (mu = inf) and dp-gibo at each mu, from theta0 = 0, on one draw of the data."""
    ex = _INDEX["normal-location"]
    x = gp.location_data(gp.rng_for(seed, run, ex, gp.DATA), cfg.n, cfg.d)
    mle = x.mean(axis=0)
    bounds = np.tile([-cfg.box, cfg.box], (cfg.d, 1)).astype(np.float64)
    kernel = PolynomialKernel(degree=2, offset=1.0)

    def loss_matrix(Z: FloatArray) -> FloatArray:
        return gaussian_location(Z, x)

    out = []
    for mu in (math.inf, *cfg.mus):
        res = _gibo(
            loss_matrix,
            np.zeros(cfg.d),
            bounds,
            T=cfg.T,
            B=cfg.B,
            mu=mu,
            b=cfg.b,
            kernel=kernel,
            updater=GradientDescent(lr=cfg.lr),
            seed=seed,
            run=run,
            example=ex,
        )
        norms = gp.gradient_norms(res, loss_matrix(res.design), x, kernel, B=cfg.B, T=cfg.T)
        objective = gaussian_location(res.thetas, x).mean(axis=1)
        out.append(
            MethodRun(
                method="gibo" if math.isinf(mu) else "dp-gibo",
                mu=None if math.isinf(mu) else mu,
                path=np.linalg.norm(res.thetas - mle, axis=1),
                x=np.arange(cfg.T + 1, dtype=np.float64),
                extras={
                    "objective": objective,
                    "objective_mle": np.array([gaussian_location(mle[None, :], x).mean()]),
                    "estimate": res.thetas,
                    "noise_floor_rms": np.array(
                        [gp.location_noise_floor(x, B=cfg.B, lr=cfg.lr, sigma=res.sigma)]
                    ),
                    **norms,
                },
                sigma=res.sigma,
            )
        )
    return out


def run_huber(cfg: HuberConfig, seed: int, run: int) -> list[MethodRun]:
    """Section 4.2: dp-gibo (RBF kernel, b = 2) vs noisy-gd, same mu, T, B and step size, from theta0 = 0."""
    ex = _INDEX["huber-regression"]
    X, y = gp.huber_data(gp.rng_for(seed, run, ex, gp.DATA), cfg.n, cfg.d)
    theta0 = np.zeros(cfg.d)
    theta_hat = gp.huber_minimiser(X, y, theta0)
    bounds = np.tile([-cfg.box, cfg.box], (cfg.d, 1)).astype(np.float64)
    res = _gibo(
        lambda Z: huber_regression(Z, X, y),
        theta0,
        bounds,
        T=cfg.T,
        B=cfg.B,
        mu=cfg.mu,
        b=cfg.b,
        kernel=SEKernel(lengthscale=cfg.lengthscale),
        updater=GradientDescent(lr=cfg.lr),
        seed=seed,
        run=run,
        example=ex,
    )
    gd = gp.noisy_gd(
        lambda theta: gp.huber_user_gradients(theta, X, y),
        theta0,
        bounds,
        T=cfg.T,
        B=cfg.B,
        mu=cfg.mu,
        lr=cfg.lr,
        rng=gp.rng_for(seed, run, ex, gp.NOISE),
    )
    steps = np.arange(cfg.T + 1, dtype=np.float64)
    extras = {"minimiser_to_truth": np.array([np.linalg.norm(theta_hat - 1.0)])}
    return [
        MethodRun(
            "dp-gibo", cfg.mu, np.linalg.norm(res.thetas - theta_hat, axis=1), steps, extras, res.sigma
        ),
        MethodRun("noisy-gd", cfg.mu, np.linalg.norm(gd - theta_hat, axis=1), steps, extras, res.sigma),
    ]


def run_tuning(cfg: TuningConfig, seed: int, run: int) -> list[MethodRun]:
    """Section 4.3: dp-gibo (AdaGrad) vs random-search and gp-ucb with DP-GIBO's number of evaluations."""
    ex = _INDEX["gp-lengthscales"]
    problem = gp.make_gp_tuning(
        gp.rng_for(seed, run, ex, gp.DATA), d=cfg.d, n_train=cfg.n_train, n_val=cfg.n_val
    )
    bd = problem.bounds
    theta0 = gp.rng_for(seed, run, ex, gp.START).uniform(bd[:, 0], bd[:, 1])
    design_values: list[FloatArray] = []

    def loss_matrix(Z: FloatArray) -> FloatArray:
        L = problem.loss_matrix(Z)
        design_values.append(L.mean(axis=1))
        return L

    res = _gibo(
        loss_matrix,
        theta0,
        bd,
        T=cfg.T,
        B=cfg.B,
        mu=cfg.mu,
        b=cfg.b,
        kernel=SEKernel(lengthscale=cfg.lengthscale),
        updater=AdaGrad(lr=cfg.lr),
        seed=seed,
        run=run,
        example=ex,
        maxiter=cfg.maxiter,
    )
    budget = int(sum(res.batch_sizes))
    iterates = problem.validation_loss(res.thetas)
    rs = gp.random_search(problem.validation_loss, bd, budget, gp.rng_for(seed, run, ex, gp.BASELINE), theta0)
    ucb = gp.gp_ucb(problem.validation_loss, bd, budget, gp.rng_for(seed, run, ex, gp.BASELINE + 1), theta0)
    best = float(min(iterates.min(), np.concatenate(design_values).min(), rs.min(), ucb.min()))
    truth = float(problem.validation_loss(problem.lengthscales[None, :])[0])
    extras = {
        "true_lengthscales_gap": np.array([truth - best]),
        "best": np.array([best]),
        "dp_best_iterate": np.array([iterates.min() - best]),  # reference only: not a private output
    }
    evals = np.arange(1, budget + 1, dtype=np.float64)
    return [
        MethodRun(
            "dp-gibo",
            cfg.mu,
            iterates - best,
            np.concatenate([[0.0], np.cumsum(res.batch_sizes)]).astype(np.float64),
            extras,
            res.sigma,
        ),
        MethodRun("random-search", None, np.minimum.accumulate(rs) - best, evals, extras),
        MethodRun("gp-ucb", None, np.minimum.accumulate(ucb) - best, evals, extras),
    ]


RUNNERS: dict[str, Callable[[Any, int, int], list[MethodRun]]] = {
    "normal-location": lambda c, s, r: run_location(c.location, s, r),
    "huber-regression": lambda c, s, r: run_huber(c.huber, s, r),
    "gp-lengthscales": lambda c, s, r: run_tuning(c.tuning, s, r),
}


def one_job(args: tuple[str, Config, int, int]) -> tuple[str, list[MethodRun]]:
    """Every method of one example on one run."""
    example, config, seed, run = args
    return example, RUNNERS[example](config, seed, run)


def _se(values: FloatArray) -> float:
    return float(values.std(ddof=1) / math.sqrt(values.size)) if values.size > 1 else 0.0


def aggregate(example: str, runs: list[MethodRun]) -> dict[str, Any]:
    """Mean / s.e. over runs of one (example, method, mu)."""
    P = np.vstack([r.path for r in runs])
    first = runs[0]
    item: dict[str, Any] = {
        "example": example,
        "method": first.method,
        "mu": first.mu,
        "runs": len(runs),
        "final_error_mean": float(P[:, -1].mean()),
        "final_error_se": _se(P[:, -1]),
        "final_errors": P[:, -1].tolist(),
        "start_error_mean": float(P[:, 0].mean()),
        "sigma": first.sigma,
        "path_mean": P.mean(axis=0).tolist(),
        "path_se": (P.std(axis=0, ddof=1) / math.sqrt(len(runs)) if len(runs) > 1 else 0 * P[0]).tolist(),
        "path_x": first.x.tolist(),
        "path_x_label": "evaluations" if example == "gp-lengthscales" else "iteration t",
    }
    for key in first.extras:
        stacked = np.stack([r.extras[key] for r in runs])
        mean = stacked.mean(axis=0)
        item[f"{key}_mean"] = float(mean[0]) if mean.shape == (1,) else mean.tolist()
    return item


def run_benchmark(
    runs: int,
    *,
    examples: Sequence[str] = EXAMPLES,
    seed: int = 0,
    workers: int = 2,
    config: Config | None = None,
    progress: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """One job per (example, run), the slowest example first; results per (example, method, mu)."""
    cfg = config or Config()
    unknown = [e for e in examples if e not in EXAMPLES]
    if unknown:
        raise ValueError(f"unknown example {unknown}; the examples are {', '.join(EXAMPLES)}")
    order = sorted(examples, key=lambda e: -_INDEX[e])
    jobs = [(e, cfg, seed, run) for e in order for run in range(runs)]
    collected: dict[tuple[str, str, float | None], list[MethodRun]] = {}
    for example, method_runs in map_runs(one_job, jobs, workers):
        for r in method_runs:
            collected.setdefault((example, r.method, r.mu), []).append(r)
        if progress:
            progress()
    keys = sorted(collected, key=lambda k: (_INDEX[k[0]], k[1] != "gibo", k[1], -(k[2] or math.inf)))
    return {
        "config": {"runs": runs, "seed": seed, "examples": list(examples), **asdict(cfg)},
        "results": [aggregate(k[0], collected[k]) for k in keys],
    }


# ------------------------------------------------------------------------------------------------ report
HEADER = [
    "example",
    "method",
    "mu",
    "runs",
    "final error mean ± s.e.",
    "start error",
    "sigma/step",
    "4.1 noise floor (RMS)",
]


def summary_rows(report: dict[str, Any]) -> list[list[str]]:
    return [
        [
            i["example"],
            i["method"],
            "inf"
            if i["mu"] is None and i["method"] == "gibo"
            else ("-" if i["mu"] is None else f"{i['mu']:g}"),
            str(i["runs"]),
            f"{i['final_error_mean']:.4f} ± {i['final_error_se']:.4f}",
            f"{i['start_error_mean']:.4f}",
            f"{i['sigma']:.4f}" if i["sigma"] else "-",
            f"{i['noise_floor_rms_mean']:.4f}" if "noise_floor_rms_mean" in i else "-",
        ]
        for i in report["results"]
    ]


def summary_table(report: dict[str, Any]) -> Any:
    title = (
        "DP-GIBO Section 4: final error (4.1: |theta_T - MLE|, 4.2: |theta_T - theta_hat|, 4.3: "
        "validation-loss gap to the run's best)"
    )
    return rich_table(title, HEADER, summary_rows(report), left=("example", "method"))


def markdown(report: dict[str, Any]) -> str:
    return markdown_table("DP-GIBO Section 4 benchmark", HEADER, summary_rows(report))


def _label(item: dict[str, Any]) -> str:
    if item["method"] == "gibo":
        return "gibo (mu = inf)"
    return item["method"] if item["mu"] is None else f"{item['method']} (mu = {item['mu']:g})"


def plot(report: dict[str, Any], path: Path) -> None:
    """A panel of error paths per example (mean ± s.e., log scale); for 4.1 also Fig. 1 (bottom)'s norms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = report["results"]
    examples = list(dict.fromkeys(i["example"] for i in res))
    panels = examples + (["bias-noise"] if "normal-location" in examples else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(5.0 * len(panels), 4.0), squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=True):
        if panel == "bias-noise":
            for item in (i for i in res if i["example"] == "normal-location" and i["mu"] is not None):
                t = np.arange(1, len(item["noise_mean"]) + 1)
                line = ax.plot(t, item["noise_mean"], label=f"noise, mu = {item['mu']:g}")[0]
                ax.plot(
                    t, item["bias_mean"], ls="--", color=line.get_color(), label=f"bias, mu = {item['mu']:g}"
                )
                ax.plot(
                    t, item["surrogate_bias_mean"], ls=":", color=line.get_color(), label="surrogate part"
                )
            ax.set_yscale("log")
            ax.set_xlabel("iteration t")
            ax.set_ylabel("gradient norm (mean over runs)")
            ax.set_title("4.1: bias vs privacy noise (Fig. 1 bottom)", fontsize=9)
        else:
            for item in (i for i in res if i["example"] == panel):
                x, m, se = (np.asarray(item[k]) for k in ("path_x", "path_mean", "path_se"))
                ax.plot(x, m, label=_label(item))
                ax.fill_between(x, np.maximum(m - se, 1e-12), m + se, alpha=0.15)
            ax.set_yscale("log")
            ax.set_xlabel(res[[i["example"] for i in res].index(panel)]["path_x_label"])
            ax.set_ylabel("error (mean ± s.e.)")
            ax.set_title(panel, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    save_figure(fig, path)


def main(
    *,
    runs: int,
    examples: Sequence[str],
    seed: int,
    workers: int,
    json_path: Path | None,
    plot_path: Path | None,
    config: Config | None = None,
) -> dict[str, Any]:
    return bench_main(
        lambda advance: run_benchmark(
            runs, examples=examples, seed=seed, workers=workers, config=config, progress=advance
        ),
        label=f"DP-GIBO ({len(examples)} examples x {runs})",
        runs=runs * len(examples),
        show=lambda report: [summary_table(report)],
        json_path=json_path,
        markdown=markdown,
        plot=plot,
        plot_path=plot_path,
    )
