"""The ``pobo bench ...`` commands (typer): utility and speed benchmarks, never tests.

Each command imports its benchmark lazily, so that ``pobo --help`` stays fast; ``shared/tools/cli.py`` mounts
``bench_app`` under ``pobo bench``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

bench_app = typer.Typer(help="Benchmarks (utility and speed); not tests.", no_args_is_help=True)

# The options most commands share.
JsonOption = Annotated[Path | None, typer.Option("--json", help="Write the results as JSON here.")]
SeedOption = Annotated[int, typer.Option(help="Benchmark seed (benchmarks only; never used in production).")]
WorkersOption = Annotated[int, typer.Option(min=1, help="Worker processes.")]


@bench_app.command("synthetic")
def bench_synthetic(
    runs: Annotated[int, typer.Option(min=1, help="Random runs per setting (paper: 50).")] = 50,
    json_path: JsonOption = None,
    plot: Annotated[Path | None, typer.Option(help="Write the Fig. 2a-style plot (PNG) here.")] = None,
    quick: Annotated[bool, typer.Option(help="A few runs of a few settings: a smoke test.")] = False,
    seed: SeedOption = 0,
    workers: WorkersOption = 2,
    strategies: Annotated[
        str | None,
        typer.Option(
            help="Compare registry strategies instead (comma-separated, e.g. gp-ucb,gp-bucb,random): simple "
            "regret by query and by round."
        ),
    ] = None,
    batch_size: Annotated[
        int, typer.Option(min=1, max=1000, help="gp-bucb's batch size k (with --strategies).")
    ] = 5,
    queries: Annotated[
        int, typer.Option(min=1, help="Queries per study, initial row included (with --strategies).")
    ] = 50,
) -> None:
    """The paper's synthetic GP experiment (Fig. 2a, Tables 1-3) in `transfer` and `mle` modes; with
    --strategies, the modeler's registry strategies compared on the same functions."""
    if strategies is None:
        from shared.tools.bench.synthetic import main as run

        run(runs=runs, json_path=json_path, plot_path=plot, quick=quick, seed=seed, workers=workers)
        return
    from shared.bo.strategies import REGISTRY
    from shared.tools.bench.strategies import main as compare

    names = [s.strip() for s in strategies.split(",") if s.strip()]
    unknown = [s for s in names if s not in REGISTRY]
    if unknown or not names:
        raise typer.BadParameter(
            f"unknown strategy {unknown}: the registry has {', '.join(sorted(REGISTRY))}",
            param_hint="--strategies",
        )
    compare(
        runs=runs,
        strategies=names,
        json_path=json_path,
        plot_path=plot,
        quick=quick,
        seed=seed,
        workers=workers,
        batch_size=batch_size,
        queries=queries,
    )


@bench_app.command("ldp")
def bench_ldp(
    runs: Annotated[int, typer.Option(min=1, help="Random runs (functions) per setting (paper: 10).")] = 10,
    T: Annotated[int, typer.Option("--T", min=2, help="Queries per study (paper: 1000).")] = 1000,
    combined_T: Annotated[
        int, typer.Option("--combined-T", min=2, help="Queries per study in the combined setting.")
    ] = 200,
    settings: Annotated[
        str, typer.Option(help="Comma-separated settings: se, matern, student-t, combined.")
    ] = "se,matern,student-t,combined",
    json_path: JsonOption = None,
    plot: Annotated[Path | None, typer.Option(help="Write the cumulative-regret plot (PNG) here.")] = None,
    seed: SeedOption = 0,
    workers: WorkersOption = 2,
    beta_multiplier: Annotated[
        float, typer.Option(min=0.0, help="The six strategies' factor on the theorems' beta (1 = as stated).")
    ] = 1.0,
) -> None:
    """The LDP-BO paper's synthetic experiments (Zhou & Tan 2021, Fig. 2a/2d, Fig. 3a): cumulative regret of
    the LDP and heavy-tailed GP-UCB strategies under CTL(eps) or Student-t noise, and output privacy on top of
    the Gaussian release (combined)."""
    from shared.tools.bench.ldp import SETTINGS
    from shared.tools.bench.ldp import main as run

    run(
        runs=runs,
        T=T,
        combined_T=combined_T,
        settings=_pick(settings, SETTINGS, "setting"),
        seed=seed,
        workers=workers,
        json_path=json_path,
        plot_path=plot,
        beta_multiplier=beta_multiplier,
    )


def _pick(text: str, known: Sequence[str], what: str) -> list[str]:
    """A comma-separated choice among ``known`` (in the order given, repeats dropped); else a usage error."""
    chosen = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in known]
    if unknown or not chosen:
        raise typer.BadParameter(f"unknown {what} {unknown}: choose from {', '.join(known)}")
    return list(dict.fromkeys(chosen))


@bench_app.command("strategies")
def bench_strategies(
    runs: Annotated[int, typer.Option(min=2, help="Runs per problem (release and noise draws).")] = 20,
    T: Annotated[int, typer.Option("--T", min=2, help="Plays per study (diabetes: 100, its cap).")] = 200,
    problems: Annotated[
        str, typer.Option(help="Comma-separated problems: synthetic, diabetes, demo-hospital.")
    ] = "synthetic,diabetes,demo-hospital",
    tune: Annotated[
        bool,
        typer.Option(
            help="Run the candidates of the rule that chose the defaults, on tuning seeds (seed + 1000), and "
            "print what the rule picks."
        ),
    ] = False,
    gibo: Annotated[
        bool, typer.Option(help="Also dp-gibo at its defaults on the breast-cancer logistic regression.")
    ] = True,
    json_path: JsonOption = None,
    seed: SeedOption = 0,
    workers: WorkersOption = 2,
) -> None:
    """Every strategy at its defaults on three input-private problems, with and without output privacy: the
    regret of the rows played over random play's (issue 32), and dp-gibo's gap closed."""
    from shared.tools.bench.defaults import main as run
    from shared.tools.bench.defaults_problems import PROBLEMS

    run(
        runs=runs,
        T=T,
        problems=_pick(problems, PROBLEMS, "problem"),
        seed=seed,
        workers=workers,
        tune=tune,
        gibo=gibo,
        json_path=json_path,
    )


@bench_app.command("gibo")
def bench_gibo(
    runs: Annotated[int, typer.Option(min=1, help="Independent runs (data draws) per example.")] = 4,
    examples: Annotated[
        str,
        typer.Option(help="Comma-separated examples: normal-location, huber-regression, gp-lengthscales."),
    ] = "normal-location,huber-regression,gp-lengthscales",
    json_path: JsonOption = None,
    plot: Annotated[Path | None, typer.Option(help="Write the error-path plot (PNG) here.")] = None,
    seed: SeedOption = 0,
    workers: WorkersOption = 2,
) -> None:
    """The DP-GIBO paper's Section 4 examples (Scalable DP Bayesian optimisation, Algorithm 1, Fig. 1-2, 4):
    normal location (4.1), Huber regression vs noisy GD (4.2), GP length-scale tuning vs random search and
    GP-UCB (4.3)."""
    from shared.tools.bench.gibo import EXAMPLES
    from shared.tools.bench.gibo import main as run

    run(
        runs=runs,
        examples=_pick(examples, EXAMPLES, "example"),
        seed=seed,
        workers=workers,
        json_path=json_path,
        plot_path=plot,
    )


@bench_app.command("fed")
def bench_fed(
    runs: Annotated[int, typer.Option(min=1, help="Independent runs per curve.")] = 10,
    settings: Annotated[
        str, typer.Option(help="Comma-separated settings: synthetic, svm-shards.")
    ] = "synthetic,svm-shards",
    json_path: JsonOption = None,
    plot: Annotated[Path | None, typer.Option(help="Write the regret-curve plot (PNG) here.")] = None,
    seed: SeedOption = 0,
    workers: WorkersOption = 2,
) -> None:
    """DP-FTS-DE's Section 5 (federated DP Thompson sampling, Algorithms 1-2, Fig. 2-3): TS vs FTS vs FTS-DE
    and the impact of S, q and z with epsilon (PLD / RDP) beside each DP curve, on a synthetic GP federation
    and on SVM tuning over dataset shards."""
    from shared.tools.bench.fed import SETTINGS
    from shared.tools.bench.fed import main as run

    run(
        runs=runs,
        settings=_pick(settings, SETTINGS, "setting"),
        seed=seed,
        workers=workers,
        json_path=json_path,
        plot_path=plot,
    )


@bench_app.command("perf")
def bench_perf(
    json_path: JsonOption = None,
    n_release: Annotated[int, typer.Option(help="Rows of the release benchmark.")] = 1_000_000,
    n_gp: Annotated[int, typer.Option(help="Candidates of the GP-UCB loop benchmark.")] = 100_000,
    n_floor: Annotated[
        int, typer.Option(min=10, help="Candidates of the GP-UCB loop timed against the bandwidth floor.")
    ] = 1_000_000,
    n_large: Annotated[
        int, typer.Option(min=0, help="Candidates of the memory-mapped T = 50 loop (0: skip it).")
    ] = 10_000_000,
    seed: Annotated[int, typer.Option(help="Benchmark seed.")] = 0,
) -> None:
    """Streaming release vs direct SVD, incremental GP-UCB vs refitting scikit-learn's GPR, the GP-UCB loop
    vs the memory-bandwidth floor."""
    from shared.tools.bench.perf import main as run

    run(json_path=json_path, n_release=n_release, n_gp=n_gp, seed=seed, n_floor=n_floor, n_large=n_large)


@bench_app.command("steps")
def bench_steps(
    json_path: JsonOption = None,
    n: Annotated[
        int, typer.Option(min=100, help="Rows of the release (and of the DP-GIBO dataset).")
    ] = 100_000,
    queries: Annotated[int, typer.Option(min=2, help="Queries per row strategy.")] = 50,
    gibo_dimension: Annotated[int, typer.Option(min=1, help="DP-GIBO's dimension d.")] = 20,
    gibo_steps: Annotated[int, typer.Option(min=1, help="DP-GIBO steps timed.")] = 10,
    seed: Annotated[int, typer.Option(help="Benchmark seed.")] = 0,
) -> None:
    """The modeler's cost of one step of every strategy (and DP-GIBO's curator oracle) at n rows."""
    from shared.tools.bench.steps import main as run

    run(
        json_path=json_path,
        n=n,
        queries=queries,
        seed=seed,
        gibo_dimension=gibo_dimension,
        gibo_steps=gibo_steps,
    )


@bench_app.command("service")
def bench_service(
    json_path: JsonOption = None,
    n: Annotated[int, typer.Option(min=10, help="Rows of the synthetic release.")] = 10_000,
    iterations: Annotated[int, typer.Option(min=2, help="Iterations per study (t <= this).")] = 50,
    studies: Annotated[int, typer.Option(min=1, help="Studies (each a fresh t = 1..iterations).")] = 3,
) -> None:
    """One HTTP iteration (suggest + curator query + observe) on loopback, beyond the GP arithmetic."""
    from shared.tools.bench.service import main as run

    run(json_path=json_path, n=n, iterations=iterations, studies=studies)


@bench_app.command("load")
def bench_load(
    json_path: JsonOption = None,
    studies: Annotated[int, typer.Option(min=1, help="Concurrent studies (one client thread each).")] = 20,
    iterations: Annotated[int, typer.Option(min=1, help="Iterations per study.")] = 50,
    workers: Annotated[
        int, typer.Option(min=1, max=64, help="uvicorn workers of each service (try the number of cores).")
    ] = 2,
    baseline_workers: Annotated[
        int, typer.Option(min=0, help="Also measure this worker count as the baseline (0: none).")
    ] = 1,
    database: Annotated[
        list[str] | None,
        typer.Option(help="sqlite and/or postgresql (repeat the option). Default: both."),
    ] = None,
    postgres_url: Annotated[
        str | None,
        typer.Option(
            help="SQLAlchemy URL of a PostgreSQL database to create throwaway schemas in. "
            "Default: env POBO_BENCH_POSTGRES_URL, else POBO_TEST_DATABASE_URL."
        ),
    ] = None,
    n: Annotated[int, typer.Option(min=10, help="Rows of the synthetic release.")] = 10_000,
    seed: Annotated[int, typer.Option(help="Benchmark seed (synthetic data, initial rows).")] = 0,
) -> None:
    """Concurrent studies x iterations against both services under uvicorn workers: throughput,
    p50/p99 latency, errors, peak RSS; every study reconciled afterwards. Exit 1 on any error."""
    from shared.tools.bench.load import LoadBenchError, LoadConfig, default_postgres_url
    from shared.tools.bench.load import main as run

    chosen = database or ["sqlite", "postgresql"]
    unknown = sorted(set(chosen) - {"sqlite", "postgresql"})
    if unknown:
        raise typer.BadParameter(
            f"unknown database {unknown}: use sqlite and/or postgresql", param_hint="--database"
        )
    url = postgres_url or default_postgres_url()
    if database and "postgresql" in database and not url:
        raise typer.BadParameter(
            "PostgreSQL needs a database to create throwaway schemas in: pass --postgres-url "
            "postgresql+psycopg://user@host:5432/db (or set POBO_BENCH_POSTGRES_URL)",
            param_hint="--postgres-url",
        )
    config = LoadConfig(
        databases=chosen,  # type: ignore[arg-type]
        postgres_url=url,
        workers=workers,
        baseline_workers=baseline_workers or None,
        studies=studies,
        iterations=iterations,
        n=n,
        seed=seed,
    )
    try:
        report = run(config, json_path=json_path)
    except LoadBenchError as exc:
        typer.echo(f"pobo bench load: {exc}", err=True)
        raise typer.Exit(2) from None
    if not report["ok"]:
        raise typer.Exit(1)


@bench_app.command("scale")
def bench_scale(
    json_path: JsonOption = None,
    n: Annotated[
        list[int] | None, typer.Option(help="Candidates (repeat the option). Default: 10^6 and 4 x 10^6.")
    ] = None,
    steps: Annotated[int, typer.Option(min=2, help="GP-UCB steps timed per loop.")] = 20,
    workers: Annotated[int, typer.Option(min=1, help="Worker processes of the LocalCluster.")] = 2,
    address: Annotated[
        str | None, typer.Option(help="A scheduler (tcp://...) instead of a LocalCluster.")
    ] = None,
    seed: Annotated[int, typer.Option(help="Benchmark seed.")] = 0,
) -> None:
    """The GP-UCB loop on a Dask LocalCluster against the local loop in the same run (overhead per step,
    memory per worker, same choices bit for bit), and the model's prediction for n = 10^8."""
    from shared.tools.bench.scale import main as run

    run(
        json_path=json_path,
        sizes=n or [1_000_000, 4_000_000],
        steps=steps,
        workers=workers,
        address=address,
        seed=seed,
    )
