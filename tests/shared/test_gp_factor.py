"""The GP factor storage (row blocks, spare reuse, memory-mapped spill) and the split element-wise passes."""

from __future__ import annotations

import numpy as np
import pytest

from shared.bo import factor as factor_mod
from shared.bo.factor import FactorRows
from shared.bo.gp import GaussianProcess, Hyperparameters, se_kernel
from shared.bo.parallel import MIN_PARALLEL, argmax, split

HP = Hyperparameters(lengthscale=1.3, signal_variance=1.7, noise_variance=1e-3)


def _filled(n: int, t: int, **options: object) -> tuple[FactorRows, np.ndarray]:
    A = np.random.default_rng(1).standard_normal((t, n))
    rows = FactorRows(n, block_rows=3, **options)  # type: ignore[arg-type]
    for row in A:
        rows.next_row()[:] = row
        rows.commit()
    return rows, A


@pytest.mark.parametrize("t", [0, 1, 3, 7])
def test_blocked_products_equal_the_dense_ones(t: int) -> None:
    rows, A = _filled(50, t)
    x = np.random.default_rng(2).standard_normal(t)
    out, tmp = np.full(50, np.nan), np.empty(50)
    for s in (slice(0, 50), slice(7, 31)):  # the whole row, and a chunk of columns
        rows.project_columns(x, s, out[s], tmp[s])
        np.testing.assert_allclose(out[s], x @ A[:, s], rtol=1e-13, atol=1e-13)
    g = rows.project(x)
    assert g is None if t == 0 else np.allclose(g, x @ A, rtol=1e-13, atol=1e-13)
    y0 = np.random.default_rng(3).standard_normal(50)
    y = y0.copy()
    rows.gemv_into(x, y, alpha=-0.5, beta=2.0)
    np.testing.assert_allclose(y, 2.0 * y0 - 0.5 * (x @ A), rtol=1e-13, atol=1e-13)
    idx = np.array([4, 0, 49])
    np.testing.assert_array_equal(rows.columns(idx), A[:, idx])
    np.testing.assert_allclose(rows.gram_rows(idx), A[:, idx].T @ A, atol=1e-12)


def test_a_float32_factor_projects_in_single_precision() -> None:
    A = np.random.default_rng(5).standard_normal((7, 40)).astype(np.float32)
    rows = FactorRows(40, block_rows=3, dtype=np.float32)
    for row in A:
        rows.next_row()[:] = row
        rows.commit()
    x = np.random.default_rng(6).standard_normal(7).astype(np.float32)
    out, tmp = np.empty(40, dtype=np.float32), np.empty(40, dtype=np.float32)
    rows.project_columns(x, slice(3, 40), out[3:], tmp[3:])
    exact = x.astype(np.float64) @ A[:, 3:].astype(np.float64)
    # float32 sums of 7 terms: within gamma_7 sum |x_i| |A_i| of the exact products (the GP's error bound)
    gamma = 7 * 2.0**-24 / (1 - 7 * 2.0**-24)
    slack = gamma * (np.abs(x).astype(np.float64) @ np.abs(A[:, 3:]).astype(np.float64)) + 2.0**-24 * np.abs(
        exact
    )
    assert (np.abs(out[3:] - exact) <= slack).all()


def test_one_blas_thread_is_counted_across_concurrent_passes() -> None:
    from threadpoolctl import threadpool_info, threadpool_limits

    from shared.bo import parallel

    def blas_threads() -> set[int]:
        return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}

    with threadpool_limits(limits=2, user_api="blas"):  # whatever the suite's environment set
        assert blas_threads() == {2}
        with parallel.one_blas_thread():
            with parallel.one_blas_thread():  # a second pass (another thread's, in a service) starts
                assert blas_threads() == {1}
            assert blas_threads() == {1}  # the first is still running
        assert blas_threads() == {2}  # the last one out restores the count


class _OwnKernelRow(GaussianProcess):
    """A GP whose kernel row comes from ``kernel_row`` (as another kernel's would): the same values."""

    def kernel_row(self, j: int) -> np.ndarray:
        return se_kernel(self.Z[j : j + 1], self.Z, self.hp)[0]


@pytest.mark.parametrize("own_kernel_row", [False, True])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_step_split_across_threads_is_the_batch_posterior(
    dtype: str, own_kernel_row: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Above MIN_PARALLEL the step's pass runs in three slices, each calling BLAS on its chunks of Z and A."""
    from shared.bo import parallel

    monkeypatch.setattr(parallel, "threads", lambda: 3)
    n = MIN_PARALLEL + 11
    Z = np.random.default_rng(8).standard_normal((n, 3))
    kind = _OwnKernelRow if own_kernel_row else GaussianProcess
    gp = kind(Z, HP, prior_mean="empirical", factor_dtype=dtype)  # type: ignore[arg-type]
    rng = np.random.default_rng(9)
    for i in rng.choice(n, 40, replace=False):  # two blocks of A and a part of a third
        gp.add(int(i), float(rng.standard_normal()), ucb_scale=2.0)
    ucb = gp.ucb_values(2.0).copy()
    batch = GaussianProcess(Z, HP, prior_mean="empirical")
    batch._rebuild(gp.indices, gp.y)  # GPML Alg. 2.1 in one batch, float64
    mean_bound, var_bound = gp.float32_bounds()
    np.testing.assert_allclose(gp.mean(), batch.mean(), rtol=0, atol=1e-9 + mean_bound)
    np.testing.assert_allclose(gp.variance(), batch.variance(), rtol=0, atol=1e-9 + var_bound)
    np.testing.assert_allclose(ucb, batch.mean() + 2.0 * batch.std(), rtol=0, atol=1e-6 + gp.ucb_bound(2.0))


def test_rows_are_written_once_and_blocks_are_reused() -> None:
    rows, A = _filled(20, 7)
    assert len(rows._blocks) == 3  # ceil(7 / 3), no doubling copies
    first = rows._blocks[0]
    rows.clear()
    rows.load(A[:2])
    assert rows.t == 2 and rows._blocks[0] is first  # a rebuild reuses the blocks it has
    np.testing.assert_array_equal(rows.columns(np.arange(20)), A[:2])
    rows.release()  # given to the spare list, taken by the next factor over the same n
    again = FactorRows(20, block_rows=3)
    assert again.next_row().base is first or np.shares_memory(again.next_row(), first)


def test_spare_list_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(factor_mod, "SPARE_LIMIT_BYTES", 3 * 8 * 10 * 2)  # two blocks of 3 x 10
    monkeypatch.setattr(factor_mod, "_spares", [])
    rows, _ = _filled(10, 12)  # four blocks
    rows.release()
    assert len(factor_mod._spares) == 2


def test_memory_mapped_blocks_give_the_same_posterior(tmp_path) -> None:
    Z = np.random.default_rng(4).standard_normal((300, 3))
    obs = [(5, 0.3), (17, -1.0), (250, 0.7), (6, 0.2), (120, 1.1)]
    dense = GaussianProcess(Z, HP, spill="never")
    mapped = GaussianProcess(Z, HP, spill="always", spill_directory=tmp_path)
    for i, y in obs:
        dense.add(i, y)
        mapped.add(i, y)
    assert mapped.factor.memory_mapped_blocks == 1 and dense.factor.memory_mapped_blocks == 0
    np.testing.assert_array_equal(mapped.mean(), dense.mean())
    np.testing.assert_array_equal(mapped.variance(), dense.variance())
    assert list(tmp_path.iterdir()) == []  # anonymous files: nothing is left behind
    mapped.factor.release()
    assert mapped.factor.memory_mapped_blocks == 0


def test_auto_spill_memory_maps_only_what_does_not_fit(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(factor_mod, "available_memory_bytes", lambda: factor_mod.SPILL_MARGIN_BYTES + 100)
    monkeypatch.setattr(factor_mod, "_default_spill_directory", None)  # (a service started earlier sets it)
    small = FactorRows(2, block_rows=3, spill="auto", spill_directory=tmp_path)  # 48 bytes a block: fits
    small.next_row()
    big = FactorRows(50, block_rows=3, spill="auto", spill_directory=tmp_path)  # 1200 bytes: does not
    big.next_row()
    nowhere = FactorRows(50, block_rows=3, spill="auto")  # no directory: stays in memory
    nowhere.next_row()
    assert (small.memory_mapped_blocks, big.memory_mapped_blocks, nowhere.memory_mapped_blocks) == (0, 1, 0)


def test_kernel_row_and_ucb_match_the_textbook_formulas() -> None:
    Z = np.random.default_rng(5).standard_normal((400, 4)) * 3.0
    for prior in ("zero", "empirical"):
        gp = GaussianProcess(Z, HP, prior_mean=prior)
        for i, y in [(3, 1.0), (30, -0.5), (399, 2.0)]:
            gp.add(i, y)
        np.testing.assert_allclose(gp.kernel_row(7), se_kernel(Z[7:8], Z, HP)[0], rtol=1e-12, atol=1e-300)
        assert gp.kernel_row(7)[7] <= HP.signal_variance  # the clamp: a distance is never negative
        c = 1.9
        np.testing.assert_array_equal(gp.upper_confidence_bound(c), gp.mean() + c * gp.std())
        out = np.empty(400)
        assert gp.upper_confidence_bound(c, out=out) is out
        mean, std = gp.posterior_at(30)
        assert (mean, std) == (gp.mean()[30], gp.std()[30])


def test_split_covers_the_range_once_and_raises_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.bo import parallel

    monkeypatch.setattr(parallel, "threads", lambda: 3)  # three slices whatever this machine has
    n = 1_000_003
    seen = np.zeros(n, dtype=np.int64)
    starts: list[int] = []

    def mark(s: slice) -> None:
        seen[s] += 1
        starts.append(s.start)

    split(mark, n)
    assert (seen == 1).all() and sorted(starts) == [0, n // 3, 2 * n // 3]

    def boom(s: slice) -> None:
        if s.start > 0:
            raise ValueError("a later slice")

    with pytest.raises(ValueError, match="a later slice"):
        split(boom, n)
    starts.clear()
    split(mark, 10)  # small: one slice, no pool
    assert starts == [0]


def test_row_details_are_the_acquisition_at_that_row() -> None:
    from shared.bo.strategies.gp_ucb import GPUCB, row_details

    Z = np.random.default_rng(6).standard_normal((500, 3))
    engine = GPUCB(Z, hyperparameters=HP, prior_mean="empirical")
    for i, y in [(10, 0.4), (20, -0.3), (30, 1.2)]:
        engine.observe(i, y)
    ucb, beta, _ = engine.acquisition()
    for index in (0, 10, 499, engine.suggest().index):
        details = row_details(engine, index, source="x")
        assert details["acquisition"] == ucb[index] and details["beta"] == beta
        assert (details["mean"], details["std"]) == (engine.gp.mean()[index], engine.gp.std()[index])
    assert row_details(engine, 10, source="x")["acquisition"] == -np.inf  # queried rows are excluded


def test_a_float32_factor_follows_the_float64_posterior_closely() -> None:
    Z = np.random.default_rng(7).standard_normal((2000, 4))
    obs = [(int(i), float(np.sin(i))) for i in np.random.default_rng(8).choice(2000, 40, replace=False)]
    exact = GaussianProcess(Z, HP, prior_mean="empirical")
    single = GaussianProcess(Z, HP, prior_mean="empirical", factor_dtype="float32")
    for i, y in obs:
        exact.add(i, y)
        single.add(i, y)
    assert single.factor.dtype == np.float32 and single.factor._blocks[0].dtype == np.float32
    np.testing.assert_allclose(single.mean(), exact.mean(), atol=1e-4)
    np.testing.assert_allclose(single.variance(), exact.variance(), atol=1e-4)
    assert not np.array_equal(single.mean(), exact.mean())  # it is an approximation, not the same numbers
    # the variance follows the stored (rounded) factor: s2 - sum of its squared columns
    A = single.factor.columns(np.arange(2000))
    np.testing.assert_allclose(single._var, HP.signal_variance - (A * A).sum(0), atol=1e-12)
    np.testing.assert_allclose(single.covariance_rows([3]), exact.covariance_rows([3]), atol=1e-4)
    single.refit(HP)  # the batch rebuild stores the factor rounded too
    np.testing.assert_allclose(single.mean(), exact.mean(), atol=1e-4)
    with pytest.raises(Exception, match="factor_dtype"):
        GaussianProcess(Z, HP, factor_dtype="float16")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("seed", "hp", "prior_mean"),
    [
        (0, HP, "empirical"),
        (1, Hyperparameters(lengthscale=3.0, signal_variance=1.0, noise_variance=1e-6), "zero"),  # ill-posed
        (2, Hyperparameters(lengthscale=0.7, signal_variance=4.0, noise_variance=1e-2), "empirical"),
    ],
)
def test_the_float32_error_bounds_hold_at_every_step(seed: int, hp: Hyperparameters, prior_mean: str) -> None:
    """``float32_bounds`` / ``ucb_bound`` bound the float32 factor's distance to the float64 GP at every step,
    over every candidate (and more tightly at each candidate by its std), and a refit's rebuild too."""
    rng = np.random.default_rng(seed)
    Z = rng.standard_normal((3000, 5))
    f = np.sin(Z @ rng.standard_normal(5)) + 0.05 * rng.standard_normal(3000)
    exact = GaussianProcess(Z, hp, prior_mean=prior_mean)
    single = GaussianProcess(Z, hp, prior_mean=prior_mean, factor_dtype="float32")
    assert exact.float32_bounds() == (0.0, 0.0) and single.float32_bounds() == (0.0, 0.0)  # nothing stored
    worst_ratio = 0.0
    for step, i in enumerate(rng.choice(3000, 60, replace=False)):
        exact.add(int(i), float(f[i]))
        single.add(int(i), float(f[i]))
        mean_bound, var_bound = single.float32_bounds()
        d_mean = np.abs(single.mean() - exact.mean())
        d_var = np.abs(single._var - exact._var)
        assert d_mean.max() <= mean_bound and d_var.max() <= var_bound, step
        c = 2.0 + step / 10
        d_ucb = np.abs(single.upper_confidence_bound(c) - exact.upper_confidence_bound(c))
        std = single.std()
        per_row = np.array([single.ucb_bound(c, s) for s in std])
        assert d_ucb.max() <= single.ucb_bound(c) and np.all(d_ucb <= per_row), step
        worst_ratio = max(worst_ratio, float(d_ucb.max() / single.ucb_bound(c)))
    assert exact.float32_bounds() == (0.0, 0.0)  # a float64 factor is the reference itself
    assert 0 < worst_ratio < 1  # a real difference, bounded
    if hp.noise_variance >= 1e-3:  # not vacuous for a well-posed GP (ill-posed, L^-1 amplifies it a lot)
        assert single.ucb_bound(3.0) < 0.5
    single.refit(hp)  # rebuilt from the rows rounded once
    assert np.abs(single.mean() - exact.mean()).max() <= single.float32_bounds()[0]


def test_the_process_default_spill_directory(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(factor_mod, "available_memory_bytes", lambda: factor_mod.SPILL_MARGIN_BYTES + 100)
    monkeypatch.setattr(factor_mod, "_default_spill_directory", None)
    before = FactorRows(50, block_rows=3)  # 1200-byte blocks do not fit, but there is nowhere to spill
    before.next_row()
    factor_mod.set_default_spill_directory(tmp_path / "spill")
    after = FactorRows(50, block_rows=3)
    after.next_row()
    assert (before.memory_mapped_blocks, after.memory_mapped_blocks) == (0, 1)
    assert (tmp_path / "spill").is_dir() and list((tmp_path / "spill").iterdir()) == []  # anonymous files


def test_the_parallel_argmax_is_numpys() -> None:
    """First maximum on ties, first NaN when there is one, wherever it falls among the threads' slices."""
    rng = np.random.default_rng(3)
    n = 2 * MIN_PARALLEL + 7
    x = rng.integers(0, 50, n).astype(float)  # many ties for the maximum, in every slice
    assert argmax(x) == int(np.argmax(x))
    x[n - 5] = 99.0  # the maximum in the last slice only
    assert argmax(x) == n - 5 == int(np.argmax(x))
    x[n - 3] = np.nan  # a NaN after the maximum wins, as in numpy
    assert argmax(x) == n - 3 == int(np.argmax(x))
    x[0] = -np.inf
    assert argmax(x[:100]) == int(np.argmax(x[:100]))  # a short array: one thread
