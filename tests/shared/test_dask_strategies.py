"""Issue 36: on the dask backend (``shared.bo.backend.set_dask_backend``) the strategies whose GP runs on the
cluster -- gp-bucb (its rounds' hallucinated variance on the partitions, ``shared.bo.hallucinated``) and
tgp-ucb / ldp-tgp-ucb (``KernelGP``'s SE or Matern-5/2 row kernel formed by each partition) -- make the
local loop's T choices, with the same UCB value, mean and std in every request's details bit for bit, on a
LocalCluster of two worker processes (the session's ``dask_client``), without gathering the posterior over
n to the driver. And ``DaskGP``'s gathered posterior and covariance rows are the local GP's bit for bit."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from shared.bo.backend import set_dask_backend
from shared.bo.strategies import Answer, get_strategy, parse_params

pytest.importorskip("distributed", reason="the dask extra (pobo[dask]) is part of pobo[test]")

pytestmark = pytest.mark.slow

LDP = {"epsilon": 2.0, "B": 1.0, "R": 1.0}
HT = {"B": 1.0, "v": 4.0, "alpha": 0.8}
FIXED = {"lengthscale": 1.0, "signal_variance": 1.0, "noise_variance": 0.01}


@pytest.fixture
def dask_backend(dask_client: Any) -> Iterator[Any]:
    """The dask backend for the test's strategies (one partition per worker), reset afterwards."""
    set_dask_backend(dask_client)
    try:
        yield dask_client
    finally:
        set_dask_backend(None)


def _problem(n: int, r: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    Z = rng.standard_normal((n, r))
    return Z, np.sin(Z @ np.linspace(1.0, -0.5, r)) + 0.3 * np.cos(3.0 * Z[:, 0])


def _drive(
    name: str,
    raw: dict[str, Any],
    *,
    T: int,
    n: int = 3000,
    r: int = 5,
    seed: int = 0,
    unavailable: np.ndarray | None = None,
) -> tuple[Any, list[tuple[int, dict[str, Any]]], list[list[Answer]]]:
    """The study's T queries through ``initial_state`` / ``plan`` / ``observe``: the strategy, every request's
    row and details (floats as hex), and the rounds of answers (for a rebuild). ``unavailable`` [n]: rows
    never to choose, and the second initial row too (it is skipped for the argmax)."""
    Z, f = _problem(n, r, seed)
    cls = get_strategy(name)
    params = parse_params(name, raw)
    state = cls.initial_state(params, n=n, budget=T, rng=np.random.default_rng(seed + 1))
    s = cls(Z, params, state)
    if unavailable is not None:
        blocked = unavailable.copy()
        blocked[state["initial_indices"][1]] = True
        s.exclude_rows(blocked)
    rng = np.random.default_rng(seed + 2)
    trace: list[tuple[int, dict[str, Any]]] = []
    rounds: list[list[Answer]] = []
    left = T
    while left > 0:
        requests = s.plan(budget=left, rng=rng)
        for q in requests:
            trace.append((q.index, {k: v.hex() if isinstance(v, float) else v for k, v in q.details.items()}))
        rounds.append([Answer(q, float(f[q.index] + 0.1 * rng.standard_normal())) for q in requests])
        s.observe(rounds[-1])
        left -= len(requests)
    return s, trace, rounds


def _posterior_means(s: Any, rows: list[int]) -> list[tuple[int, dict[str, Any]]]:
    means = [s.posterior_mean(i) for i in rows]
    return [(i, {"posterior_mean": None if m is None else m.hex()}) for i, m in zip(rows, means, strict=True)]


def _loop(name: str, raw: dict[str, Any], **kwargs: Any) -> tuple[list[tuple[int, dict[str, Any]]], str]:
    """``_drive``'s trace with the posterior mean at the last row, and the type of the strategy's GP."""
    s, trace, _ = _drive(name, raw, **kwargs)
    gp = getattr(s, "gp", None) or getattr(s, "engine").gp  # noqa: B009 (typed as the base class)
    return trace + _posterior_means(s, [trace[-1][0]]), type(gp).__name__


def _no_n_vector(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the loop gathered an n-vector from the partitions")


def _same_on_both_backends(
    name: str, raw: dict[str, Any], client: Any, monkeypatch: pytest.MonkeyPatch, **kwargs: Any
) -> None:
    """The local loop, then the dask loop (which never gathers the posterior over n), compared."""
    from shared.bo.dask_gp import DaskGP

    set_dask_backend(None)
    local, local_gp = _loop(name, raw, **kwargs)
    set_dask_backend(client)
    with monkeypatch.context() as patch:
        for method in ("_gathered", "covariance_rows"):
            patch.setattr(DaskGP, method, _no_n_vector)
        remote, remote_gp = _loop(name, raw, **kwargs)
    assert (local_gp, remote_gp) == ("KernelGP" if "tgp" in name else "GaussianProcess", "DaskGP")
    assert len(local) == kwargs["T"] + 1
    for key in ("acquisition", "mean", "std"):
        assert all(key in d for _, d in local[:-1])
    assert remote == local


def test_the_gathered_posterior_and_covariance_rows_are_the_local_ones(dask_backend: Any) -> None:
    from shared.bo.dask_gp import DaskGP
    from shared.bo.gp import GaussianProcess, Hyperparameters

    Z, f = _problem(3000, 5, seed=11)
    hp = Hyperparameters(lengthscale=1.3, signal_variance=0.8, noise_variance=1e-2)
    gps = [
        GaussianProcess(Z, hp, prior_mean="empirical"),
        DaskGP(Z, hp, client=dask_backend, partitions=3, prior_mean="empirical"),
    ]
    for gp in gps:
        for i in (4, 700, 1500, 2999, 64, 65):
            gp.add(i, float(f[i]))
    rows = [0, 63, 64, 1999, 2999]
    for method in ("mean", "variance", "std"):
        assert getattr(gps[0], method)().tobytes() == getattr(gps[1], method)().tobytes(), method
    assert gps[0].covariance_rows(rows).tobytes() == gps[1].covariance_rows(rows).tobytes()
    assert [gps[0].variance_at(i) for i in rows] == [gps[1].variance_at(i) for i in rows]


def test_gp_bucb_at_its_defaults_makes_the_same_choices_bit_for_bit(
    dask_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Maximum-likelihood refits, rounds of 4 rows with the hallucinated variances downdated on the
    partitions (``_same_on_both_backends`` refuses any gathering of an n-vector)."""
    _same_on_both_backends("gp-bucb", {"batch_size": 4}, dask_backend, monkeypatch, T=20)


def test_gp_bucb_with_fixed_hyperparameters_and_unavailable_rows(
    dask_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = np.zeros(2500, dtype=bool)
    blocked[::7] = True
    raw = {"batch_size": 5, "hyperparameters": FIXED, "initial_points": 2}
    _same_on_both_backends(
        "gp-bucb", raw, dask_backend, monkeypatch, T=20, n=2500, seed=3, unavailable=blocked
    )


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("tgp-ucb", HT),
        ("ldp-tgp-ucb", LDP),
        ("ldp-tgp-ucb", {**LDP, "kernel": "matern52", "lengthscale": 0.8}),
    ],
    ids=["tgp-ucb-se", "ldp-tgp-ucb-se", "ldp-tgp-ucb-matern52"],
)
def test_tgp_ucb_makes_the_same_choices_bit_for_bit(
    name: str, raw: dict[str, Any], dask_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The partitions form their ranges of every kernel row (SE or Matern-5/2, ``StepMessage.row``)."""
    _same_on_both_backends(name, raw, dask_backend, monkeypatch, T=20, seed=5)


def test_ldp_tgp_ucb_with_unavailable_rows(dask_backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = np.zeros(3000, dtype=bool)
    blocked[1::3] = True
    _same_on_both_backends(
        "ldp-tgp-ucb",
        {**LDP, "initial_points": 3},
        dask_backend,
        monkeypatch,
        T=15,
        seed=7,
        unavailable=blocked,
    )


def test_a_memory_mapped_z_reaches_the_partitions_as_its_file(dask_client: Any, tmp_path: Any) -> None:
    """Workers that read this process's files (the local cluster) get a memory-mapped Z's path: each partition
    loads its own rows (no rows travel in a task), and the choices are those of the array, bit for bit. A Z
    that is not a whole read-only .npy map (a copy, a slice), or workers that cannot read the files, still
    get the rows."""
    from shared.bo.backend import make_gp, npy_file
    from shared.bo.gp import Hyperparameters

    Z, f = _problem(2600, 4, seed=13)
    path = tmp_path / "z.npy"
    np.save(path, Z)
    mapped = np.load(path, mmap_mode="r")
    assert npy_file(mapped) == str(path) and npy_file(np.ascontiguousarray(mapped)) == str(path)
    assert npy_file(mapped[1:]) is None and npy_file(np.array(mapped)) is None and npy_file(Z) is None
    hp = Hyperparameters(lengthscale=1.0, signal_variance=1.0, noise_variance=1e-2)
    traces, paths = [], []
    for source, reads in ((Z, True), (mapped, False), (mapped, True)):
        set_dask_backend(dask_client, 3, workers_read_files=reads)
        try:
            gp = make_gp(source, hp)
            paths.append(getattr(gp, "_path"))  # noqa: B009 (DaskGP's own attribute)
            trace = []
            for i in (5, 900, 2001):
                gp.add(i, float(f[i]))
            for _ in range(8):
                j, value = gp.ucb_argmax(2.0, np.zeros(0, dtype=np.int64))
                trace.append((j, value.hex()))
                gp.add(j, float(f[j]))
            traces.append(trace)
        finally:
            set_dask_backend(None)
    assert paths == [None, None, str(path)]
    assert traces[0] == traces[1] == traces[2]


# ------------------------------------------------------------------ the Nystrom strategies (ATA, MoMA)
#: A beta that explores (a new row most rounds, so the dictionary grows) within a short test.
EXPLORE = {"beta_multiplier": 0.1}


def _nystrom_loop(
    name: str, raw: dict[str, Any], *, n: int = 3000, **kwargs: Any
) -> tuple[list[tuple[int, dict[str, Any]]], Any, list[list[Answer]]]:
    """``_drive`` for the strategies without a GP: the trace with the posterior mean at three rows, the
    strategy's remote posterior (None on the local backend), and the rounds of answers (for a rebuild)."""
    s, trace, rounds = _drive(name, raw, n=n, **kwargs)
    trace += _posterior_means(s, [trace[-1][0], 0, n - 1])
    return trace, getattr(s, "remote"), rounds  # noqa: B009 (the Nystrom strategies' own attribute)


def _same_nystrom_on_both_backends(
    name: str,
    raw: dict[str, Any],
    client: Any,
    monkeypatch: pytest.MonkeyPatch,
    partitions: int | None = None,
    **kwargs: Any,
) -> list[list[Answer]]:
    """The local loop, then the dask loop (which reads the posterior at a few rows only), compared."""
    from shared.bo.dask_nystrom import NystromPosterior

    reads: list[int] = []
    at = NystromPosterior.at

    def counted(self: NystromPosterior, indices: Any, scale: float = 0.0) -> Any:
        reads.append(int(np.atleast_1d(indices).size))
        return at(self, indices, scale)

    set_dask_backend(None)
    local, local_remote, rounds = _nystrom_loop(name, raw, **kwargs)
    set_dask_backend(client, partitions)
    try:
        with monkeypatch.context() as patch:
            patch.setattr(NystromPosterior, "at", counted)
            remote, posterior, _ = _nystrom_loop(name, raw, **kwargs)
    finally:
        set_dask_backend(None)
    assert local_remote is None and isinstance(posterior, NystromPosterior)
    assert len(posterior.bounds) == (partitions or 2)
    assert reads and max(reads) <= kwargs["T"]  # the played rows at most: no n-vector to the driver
    assert len(local) == kwargs["T"] + 3
    for key in ("acquisition", "mean", "std"):
        assert all(key in d for _, d in local[: kwargs["T"]])
    assert any(d["source"] == name for _, d in local[: kwargs["T"]])
    assert remote == local
    return rounds


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("ata-gp-ucb", HT),
        ("moma-gp-ucb", {**HT, **EXPLORE, "k": 3}),
        ("ldp-ata-gp-ucb", {**LDP, **EXPLORE}),
        ("ldp-moma-gp-ucb", {**LDP, **EXPLORE}),
    ],
    ids=["ata-gp-ucb", "moma-gp-ucb", "ldp-ata-gp-ucb", "ldp-moma-gp-ucb"],
)
def test_nystrom_strategies_make_the_same_choices_bit_for_bit(
    name: str, raw: dict[str, Any], dask_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each round's (MoMA: epoch's) approximate posterior at all n is formed on the partitions from the
    driver's dictionary factors (``shared.bo.dask_nystrom``): same choices, UCB value, mean and std."""
    _same_nystrom_on_both_backends(name, raw, dask_backend, monkeypatch, T=25, seed=5)


def test_ldp_ata_matern_with_unavailable_rows_on_three_partitions(
    dask_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked = np.zeros(3000, dtype=bool)
    blocked[1::3] = True
    raw = {**LDP, "kernel": "matern52", "lengthscale": 0.8, "initial_points": 3}
    _same_nystrom_on_both_backends(
        "ldp-ata-gp-ucb", raw, dask_backend, monkeypatch, partitions=3, T=20, seed=7, unavailable=blocked
    )


def test_moma_with_a_per_row_cap_and_a_short_last_epoch(
    dask_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """MoMA's cap on plays per row excludes rows before the argmax (here it moves the choice off a row the
    uncapped loop plays four epochs running; the any-finite check runs on the partitions' answers);
    T = 23 with k = 3 ends on a short epoch."""
    raw = {**HT, "k": 3, "initial_points": 2, "max_plays_per_row": 5}
    _same_nystrom_on_both_backends("moma-gp-ucb", raw, dask_backend, monkeypatch, partitions=3, T=23)


@pytest.mark.parametrize("name", ["ldp-ata-gp-ucb", "moma-gp-ucb"])
def test_a_rebuilt_nystrom_strategy_is_the_local_rebuild(
    name: str, dask_backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``from_history`` replays on the driver at the played rows, then forms the last posterior on the
    partitions: the next plan and the posterior mean are the local rebuild's bit for bit."""
    raw = {**(LDP if name.startswith("ldp") else {**HT, "k": 5}), **EXPLORE}  # k = 5: three epochs in 15
    rounds = _same_nystrom_on_both_backends(name, raw, dask_backend, monkeypatch, T=15, seed=9)
    Z, _ = _problem(3000, 5, 9)
    cls = get_strategy(name)
    params = parse_params(name, raw)
    state = cls.initial_state(params, n=3000, budget=40, rng=np.random.default_rng(10))
    plans = []
    for client in (None, dask_backend):
        set_dask_backend(client)
        try:
            s = cls.from_history(Z, params, state, rounds)
            plans.append(
                [
                    (q.index, {k: v.hex() if isinstance(v, float) else v for k, v in q.details.items()})
                    for q in s.plan(budget=25, rng=np.random.default_rng(0))
                ]
                + [(i, s.posterior_mean(i).hex()) for i in (rounds[-1][0].request.index, 17)]
            )
        finally:
            set_dask_backend(None)
    assert plans[0] == plans[1]
