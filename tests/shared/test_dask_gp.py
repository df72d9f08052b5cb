"""Issue 36: the GP loop on Dask (``shared.bo.dask_gp``) makes the single-process loop's choices, with the
same acquisition values bit for bit, on a LocalCluster of two worker processes: GP-UCB at its defaults
(maximum-likelihood refits, empirical prior mean), above the size where the local pass splits across
threads, a tie planted across a partition border, and a worker killed in the middle of the loop."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from shared.bo.gp import Hyperparameters
from shared.bo.parallel import MIN_PARALLEL
from shared.bo.partition import ALIGN, partition_bounds
from shared.bo.strategies.gp_ucb import GPUCB

distributed = pytest.importorskip("distributed", reason="the dask extra (pobo[dask]) is part of pobo[test]")

from shared.bo.dask_gp import DaskGP  # noqa: E402

pytestmark = pytest.mark.slow

FIXED = Hyperparameters(lengthscale=1.0, signal_variance=1.0, noise_variance=1e-2)


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    env = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, env=env
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        yield c


def _problem(n: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    Z = rng.standard_normal((n, 4))
    return Z, np.sin(Z @ np.array([1.0, -0.5, 0.3, 0.2])) + 0.3 * np.cos(3 * Z[:, 0])


def _engine(Z: np.ndarray, client: Any | None, hp: Any, partitions: int = 3) -> GPUCB:
    engine = GPUCB(Z, hyperparameters=hp)
    if client is not None:
        engine.gp = DaskGP(
            Z, engine.gp.hp, client=client, partitions=partitions, prior_mean=engine.gp.prior_mean
        )
    return engine


def _run(engine: GPUCB, f: np.ndarray, steps: int, trace: list[tuple[int, str, str, str]]) -> None:
    for _ in range(steps):
        s = engine.suggest()
        trace.append((s.index, s.acquisition.hex(), s.mean.hex(), s.std.hex()))
        engine.observe(s.index, float(f[s.index]))


def test_partitions_sit_at_multiples_of_64_rows() -> None:
    for n, parts in ((3000, 3), (64, 4), (10**6, 7), (65, 2)):
        bounds = partition_bounds(n, parts)
        assert bounds[0][0] == 0 and bounds[-1][1] == n and len(bounds) <= parts
        assert all(a % ALIGN == 0 and b > a for a, b in bounds)
        assert all(b == a2 for (_, b), (a2, _) in zip(bounds[:-1], bounds[1:], strict=True))


def test_gp_ucb_at_its_defaults_makes_the_same_choices_bit_for_bit(client: Any) -> None:
    """Maximum-likelihood refits (t = 3..10, then every 5th) rebuild every partition; the choices, the
    acquisition values and the posterior at each choice are the local loop's, bit for bit."""
    Z, f = _problem(3000)
    traces: list[list[tuple[int, str, str, str]]] = [[], []]
    for trace, c in zip(traces, (None, client), strict=True):
        engine = _engine(Z, c, "mle")
        for i in (5, 17, 99):
            engine.observe(i, float(f[i]))
        _run(engine, f, 24, trace)
    assert traces[0] == traces[1]


def test_the_same_bits_above_the_size_where_the_local_pass_splits_across_threads(client: Any) -> None:
    """Locally the pass over n > MIN_PARALLEL runs chunk by chunk in threads; each partition here is below
    it and runs its products over its whole range: the numbers are the same."""
    n = MIN_PARALLEL + 50_000
    Z, f = _problem(n, seed=2)
    traces: list[list[tuple[int, str, str, str]]] = [[], []]
    for trace, c in zip(traces, (None, client), strict=True):
        _run(_engine(Z, c, FIXED, partitions=2), f, 6, trace)
    assert traces[0] == traces[1]


def test_a_tie_across_a_partition_border_goes_to_the_smaller_index(client: Any) -> None:
    """Two identical candidates on either side of a border have the same acquisition value bit for bit;
    the first maximum (numpy's rule over all n) is the smaller index, on both backends."""
    Z, f = _problem(3000, seed=3)
    border = partition_bounds(3000, 3)[1][0]
    Z[border] = Z[border - 1]  # twins, one on each side of the border
    others = np.ones(3000, dtype=bool)
    others[[border - 1, border]] = False
    found = []
    for c in (None, client):
        engine = _engine(Z, c, FIXED)
        for i in (3, 1500, 2990):
            engine.observe(i, float(f[i]))
        s = engine.suggest(unavailable=others)  # only the twins are left
        found.append((s.index, s.acquisition.hex()))
        engine.observe(s.index, float(f[s.index]))
        assert engine.suggest(unavailable=others).index == border  # then its twin
    assert found[0] == found[1] and found[0][0] == border - 1


def test_a_worker_killed_in_the_middle_of_the_loop_changes_nothing(client: Any) -> None:
    """Dask recomputes the lost partitions from their first version along the chain of steps."""
    Z, f = _problem(3000, seed=4)
    local: list[tuple[int, str, str, str]] = []
    _run(_engine(Z, None, FIXED), f, 20, local)
    remote: list[tuple[int, str, str, str]] = []
    engine = _engine(Z, client, FIXED, partitions=4)
    _run(engine, f, 10, remote)
    pids = client.run(os.getpid)  # {worker address: pid}
    distributed.wait(engine.gp._futures)
    holders = client.who_has(engine.gp._futures)  # {key: (worker address, ...)}
    victim = next(iter(holders.values()))[0]
    os.kill(pids[victim], signal.SIGKILL)  # no clean-up: its partitions' versions are gone
    _run(engine, f, 10, remote)
    assert victim not in client.scheduler_info()["workers"]  # it died (its nanny started another)
    assert remote == local


def test_a_restart_rebuilds_the_same_posterior_on_both_backends(client: Any) -> None:
    """Losing the modeler (or the scheduler) loses the partitions: the strategy is rebuilt from the audit
    log (``GPUCB.from_history``: the refits replayed on prefixes, then one batch rebuild of every partition).
    The batch rebuild is not the incremental loop bit for bit (another order of operations; the local backend
    restarts the same way), but both backends rebuild the same numbers and then make the same choices."""
    from shared.bo.backend import set_dask_backend

    Z, f = _problem(3000, seed=5)
    engine = _engine(Z, None, "mle")
    for i in (5, 17, 99):
        engine.observe(i, float(f[i]))
    _run(engine, f, 12, [])
    history = engine.observations
    traces: list[list[tuple[int, str, str, str]]] = [[], []]
    for trace, c in zip(traces, (None, client), strict=True):
        set_dask_backend(c, 3)
        try:
            rebuilt = GPUCB.from_history(Z, history, hyperparameters="mle")
        finally:
            set_dask_backend(None)
        assert type(rebuilt.gp).__name__ == ("GaussianProcess" if c is None else "DaskGP")
        _run(rebuilt, f, 8, trace)
    assert traces[0] == traces[1]
