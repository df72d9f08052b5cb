"""DP-FTS-DE numerics (issue 16): RFF, eq. (2), regions, Algorithms 1 and 2, accounting, exact privacy loss.

Independent computations: the exact SE kernel, the dense GP posterior of eq. (1) with k = phi^T phi,
a literal loop transcript of Algorithm 1 (lines 5-11), dp-accounting called directly, numerical
integration of hockey-stick divergences.
"""

from __future__ import annotations

import json
import math
from typing import Any

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import integrate, stats

from shared.accounting import federated_epsilon, federated_epsilon_replace_one
from shared.errors import InputDataError
from shared.federated import (
    RandomFourierFeatures,
    RFFPosterior,
    TemperatureSchedule,
    agent_submission,
    aggregate_round,
    beta_t,
    choose_query,
    clean_aggregate,
    clip_rows,
    compare_rules,
    draw_rff,
    frozen_round_delta,
    initial_points,
    maximize_rff,
    noise_std,
    p_t,
    poisson_sample,
    renormalised_round_delta,
    round_mechanism,
    round_robin,
    se_kernel,
    softmax_weights,
    split_box,
)
from shared.federated.privacy import RDP_ORDERS, _scale_hockey_stick
from shared.privacy.lattice import LatticeGaussian, sum_step
from tests.shared.lattice_reference import dithered_noise

# ---------------------------------------------------------------------------------------------- RFF


def test_rff_approximates_se_kernel_at_rate_one_over_sqrt_m() -> None:
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, size=(60, 3))
    K = se_kernel(X, X, [0.5, 0.7, 0.9], 1.7)
    errors = {}
    for M in (100, 400, 1600):
        errs = []
        for seed in range(8):
            rff = draw_rff(3, M, [0.5, 0.7, 0.9], 1.7, rng=np.random.default_rng(100 + seed))
            Phi = rff.features(X)
            errs.append(np.abs(Phi @ Phi.T - K).mean())
        errors[M] = float(np.mean(errs))
    # each 4x more features halves the error (O(M^-1/2)); allow sampling slack
    assert 1.5 < errors[100] / errors[400] < 2.7
    assert 1.5 < errors[400] / errors[1600] < 2.7
    scaled = [errors[M] * math.sqrt(M) for M in errors]
    assert max(scaled) / min(scaled) < 1.5


def test_rff_public_roundtrip_is_json_and_rebuilds_the_same_features() -> None:
    rff = draw_rff(2, 50, 0.3, 2.0, rng=np.random.default_rng(1))
    public = json.loads(json.dumps(rff.to_public()))
    again = RandomFourierFeatures.from_public(public)
    X = np.random.default_rng(2).random((7, 2))
    np.testing.assert_array_equal(again.features(X), rff.features(X))
    assert (public["M"], public["d"], public["kind"]) == (50, 2, "rff-se")
    bad = dict(public, frequencies=public["frequencies"][:-1])
    with pytest.raises(InputDataError, match="frequencies must have shape"):
        RandomFourierFeatures.from_public(bad)
    with pytest.raises(InputDataError, match="kind"):
        RandomFourierFeatures.from_public({"kind": "other"})


def test_rff_gradient_matches_finite_differences() -> None:
    rff = draw_rff(3, 40, 0.4, rng=np.random.default_rng(3))
    omega = np.random.default_rng(4).standard_normal(40)
    x = np.array([0.2, -0.1, 0.5])
    v, g = rff.value_and_grad(x, omega)
    assert v == pytest.approx(float(rff.features(x)[0] @ omega))
    h = 1e-6
    fd = [
        (rff.value_and_grad(x + h * e, omega)[0] - rff.value_and_grad(x - h * e, omega)[0]) / (2 * h)
        for e in np.eye(3)
    ]
    np.testing.assert_allclose(g, fd, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------------- posterior, eq. 2


def test_rff_posterior_matches_dense_computation_and_gp_form() -> None:
    rng = np.random.default_rng(5)
    rff = draw_rff(2, 30, 0.3, rng=rng)
    X, Xs = rng.random((12, 2)), rng.random((9, 2))
    y = np.sin(4 * X[:, 0]) + 0.1 * rng.standard_normal(12)
    lam = 0.3
    post = RFFPosterior(rff.features(X), y, lam=lam)
    Phi = rff.features(X)
    Sigma = Phi.T @ Phi + lam * np.eye(30)
    np.testing.assert_allclose(post.nu, np.linalg.inv(Sigma) @ Phi.T @ y, rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(post.covariance(), lam * np.linalg.inv(Sigma), rtol=1e-8, atol=1e-10)
    # eq. (1) with k = phi^T phi: mu_t(x) = k_t(x)^T (K_t + lambda I)^-1 y = phi(x)^T nu_t
    Ks, Kt = rff.features(Xs) @ Phi.T, Phi @ Phi.T
    np.testing.assert_allclose(
        rff.features(Xs) @ post.nu, Ks @ np.linalg.solve(Kt + lam * np.eye(12), y), atol=1e-9
    )


def test_thompson_sample_has_the_eq2_mean_and_covariance() -> None:
    rng = np.random.default_rng(6)
    rff = draw_rff(1, 5, 0.5, rng=rng)
    X = rng.random((8, 1))
    post = RFFPosterior(rff.features(X), np.cos(3 * X[:, 0]), lam=0.5)
    n = 40_000
    S = post.sample(np.random.default_rng(7), n_samples=n, beta=1.5)
    cov = 1.5**2 * post.covariance()
    np.testing.assert_allclose(S.mean(0), post.nu, atol=5 * np.sqrt(np.diag(cov).max() / n))
    np.testing.assert_allclose(np.cov(S.T), cov, atol=0.05 * np.abs(cov).max())
    # whitened samples are N(0, I): each coordinate passes a KS test at alpha = 1e-6 ...
    L = np.linalg.cholesky(np.linalg.inv(cov))
    Zw = (S - post.nu) @ L
    assert min(stats.kstest(Zw[:, j], "norm").pvalue for j in range(5)) > 1e-6
    # ... and the control with the wrong beta (scale 1 instead of 1.5) fails it
    Zc = (post.sample(np.random.default_rng(8), n_samples=n) - post.nu) @ L
    assert stats.kstest(Zc[:, 0], "norm").pvalue < 1e-6
    assert post.sample(np.random.default_rng(9)).shape == (5,)


def test_prior_without_observations_and_beta_t() -> None:
    post = RFFPosterior(np.zeros((0, 4)), np.zeros(0), lam=2.0)
    np.testing.assert_array_equal(post.nu, np.zeros(4))
    np.testing.assert_allclose(post.covariance(), np.eye(4))
    # beta_t = B + sigma sqrt(2 (gamma + 1 + log(4 / delta))): 1 + 0.5 sqrt(2 (3 + 1 + log 40))
    assert beta_t(1.0, 0.5, 3.0, 0.1) == pytest.approx(1 + 0.5 * math.sqrt(2 * (4 + math.log(40))))
    with pytest.raises(InputDataError, match="lam"):
        RFFPosterior(np.zeros((1, 2)), np.zeros(1), lam=0.0)


# ------------------------------------------------------------------------------------- regions


@pytest.mark.parametrize("P", [1, 2, 3, 4, 6, 8, 12, 30])
@pytest.mark.parametrize("box", [([0, 0], [1, 1]), ([-1, 0, 2], [3, 0.5, 2.5])])
def test_regions_have_equal_volume_and_tile_the_box(P: int, box: tuple[list[float], list[float]]) -> None:
    lower, upper = np.array(box[0], float), np.array(box[1], float)
    R = split_box(lower, upper, P)
    assert R.P == P and R.lo.shape == (P, len(lower))
    vol = np.prod(upper - lower)
    np.testing.assert_allclose(R.volumes(), vol / P, rtol=1e-12)
    pts = lower + np.random.default_rng(P).random((4000, len(lower))) * (upper - lower)
    pts = np.vstack([pts, lower, upper])
    reg = R.region_of(pts)
    inside = (pts[:, None, :] >= R.lo[None]) & (pts[:, None, :] <= R.hi[None])
    assert inside.all(-1)[np.arange(len(pts)), reg].all()  # each point lies in its region
    # the interiors are disjoint: at most one cell contains a point strictly
    strictly = ((pts[:, None, :] > R.lo[None]) & (pts[:, None, :] < R.hi[None])).all(-1)
    assert (strictly.sum(1) <= 1).all()


def test_regions_grid_shape_and_refused_p() -> None:
    np.testing.assert_array_equal(split_box([0, 0], [1, 1], 4).counts, [2, 2])
    np.testing.assert_array_equal(split_box([0, 0], [2, 1], 2).counts, [2, 1])
    for bad in (11, 13, 22, 0):
        with pytest.raises(InputDataError, match="P must"):
            split_box([0, 0], [1, 1], bad)
    with pytest.raises(InputDataError, match="inside the box"):
        split_box([0], [1], 2).region_of([[1.5]])


def test_round_robin_assignment() -> None:
    a = round_robin(29, 4)
    np.testing.assert_array_equal(a, np.arange(29) % 4)
    np.testing.assert_array_equal(np.bincount(a), [8, 7, 7, 7])


# ------------------------------------------------------------------------- coordinator, Algorithm 1


def _algorithm1_by_the_lines(N, P, subs, sampled, S, q, z, varphi, eta):  # type: ignore[no-untyped-def]
    """Literal transcript of Algorithm 1 lines 5-11 (loops, no vectorisation)."""
    M = eta.shape[1]
    out = np.zeros((P, M))  # line 5
    for i in range(P):  # line 7
        for n in sorted(sampled):  # line 8
            if n not in subs:
                continue  # did not submit: contributes nothing
            w = np.asarray(subs[n], float)
            w_hat = w / max(1.0, np.linalg.norm(w) / (S / math.sqrt(P)))  # line 9
            out[i] += varphi[i, n] / q * w_hat  # line 10
        out[i] += eta[i]  # line 11 (eta ~ N(0, (z varphi_max S / q)^2 I))
    return out


def with_exact_noise(clean: np.ndarray, mechanism: LatticeGaussian, seed: int) -> np.ndarray:
    """What line 11 releases from ``clean`` with the generator default_rng(seed): the clean aggregate snapped
    to the lattice g Z^(P x M) plus integer noise rint((N + V) / g) (V: the dither), times g (never
    clean + float noise)."""
    g = mechanism.granularity
    return g * (
        np.rint(clean / g) + dithered_noise(np.random.default_rng(seed), clean.shape, mechanism.steps)
    )


def test_aggregate_by_hand_on_fixed_inputs() -> None:
    # N = 3, P = 2, uniform weights (T = inf): varphi = 1/3; S = 2 -> clip bound sqrt(2)
    subs = {0: [3.0, 4.0], 1: [0.5, 0.5]}  # agent 2 did not submit
    kw: dict[str, Any] = {"M": 2, "P": 2, "S": 2.0, "q": 0.5, "temperature": math.inf}
    out = aggregate_round(3, subs, [0, 1, 2], z=1.0, rng=np.random.default_rng(0), **kw)
    w0 = np.array([3.0, 4.0]) / 5.0 * math.sqrt(2)  # clipped from norm 5 to sqrt(2)
    w1 = np.array([0.5, 0.5])  # norm 0.71 < sqrt(2): unchanged
    expected = (w0 + w1) / 3.0 / 0.5
    clean, varphi = clean_aggregate(3, subs, [0, 1, 2], **kw)
    h = sum_step(3, 2.0 / (0.5 * math.sqrt(2)))  # each agent's contribution is snapped to h before the sum
    np.testing.assert_allclose(clean, np.vstack([expected, expected]), rtol=0, atol=3 * h / 2)
    mechanism = round_mechanism(varphi, S=2.0, q=0.5, z=1.0, M=2)
    np.testing.assert_array_equal(out, with_exact_noise(clean, mechanism, 0))
    paper = 1.0 * (1 / 3) * 2.0 / 0.5  # z varphi_max S / q, for the P * M = 4 coordinates
    assert mechanism.dim == 4 and paper <= mechanism.sigma <= paper * (1 + 2.0**-20)


def test_aggregate_matches_algorithm1_transcript_with_softmax_weights() -> None:
    rng = np.random.default_rng(11)
    N, P, M, S, q, z = 9, 3, 6, 3.0, 0.4, 1.3
    subs = {n: rng.standard_normal(M) * (3 if n % 2 else 0.3) for n in range(N) if n != 4}
    sampled = {0, 1, 2, 4, 7, 8}
    out = aggregate_round(N, subs, sampled, M=M, P=P, S=S, q=q, z=z, temperature=1.0, rng=rng_12())
    # varphi by hand (Section 3.2): regions of n mod 3, a = 15, T = 1
    e_in, e_out = math.exp(16.0), math.exp(1.0)
    varphi = np.where(np.arange(N)[None, :] % P == np.arange(P)[:, None], e_in, e_out) / (
        3 * e_in + 6 * e_out
    )
    np.testing.assert_allclose(softmax_weights(round_robin(N, P), P, 1.0), varphi, rtol=1e-12)
    ref = _algorithm1_by_the_lines(N, P, subs, sampled, S, q, z, varphi, np.zeros((P, M)))
    clean, _ = clean_aggregate(N, subs, sampled, M=M, P=P, S=S, q=q, temperature=1.0)
    h = sum_step(N, S / (q * math.sqrt(P)))  # the exact sum's snapping: at most h / 2 per agent
    np.testing.assert_allclose(clean, ref, rtol=0, atol=N * h / 2)
    # line 11: the noise std is z varphi_max S / q for the P * M coordinates, added exactly
    mechanism = round_mechanism(varphi, S=S, q=q, z=z, M=M)
    np.testing.assert_array_equal(out, with_exact_noise(clean, mechanism, 12))
    assert mechanism.dim == P * M and mechanism.sigma == pytest.approx(z * varphi.max() * S / q, rel=1e-6)
    assert mechanism.sigma == noise_std(varphi, S=S, q=q, z=z, M=M)


def rng_12() -> np.random.Generator:
    return np.random.default_rng(12)


def test_missing_straggling_or_unsampled_agent_contributes_zero_and_nothing_is_renormalised() -> None:
    rng = np.random.default_rng(13)
    N, P, M, S, q, z = 10, 2, 4, 2.0, 0.5, 1.0
    subs = {n: rng.standard_normal(M) for n in range(N)}
    kw: dict[str, Any] = {"M": M, "P": P, "S": S, "q": q, "temperature": 1.0}
    full = clean_aggregate(N, subs, range(N), **kw)[0]
    k = 3
    missing = clean_aggregate(N, {n: v for n, v in subs.items() if n != k}, range(N), **kw)[0]
    unsampled = clean_aggregate(N, subs, [n for n in range(N) if n != k], **kw)[0]
    zero = clean_aggregate(N, {**subs, k: np.zeros(M)}, range(N), **kw)[0]
    np.testing.assert_allclose(missing, unsampled)
    np.testing.assert_allclose(missing, zero)
    # the difference is exactly agent k's own weighted, clipped vector: the others' weights are unchanged
    varphi = softmax_weights(round_robin(N, P), P, 1.0)
    w_hat = clip_rows(subs[k], S / math.sqrt(P))
    np.testing.assert_allclose(full - missing, varphi[:, [k]] * w_hat[None, :] / q, atol=1e-12)
    # and the noise does not depend on who submitted: the same generator gives the same integer noise
    nobody = aggregate_round(N, {}, [], z=z, rng=np.random.default_rng(0), **kw)
    everyone = aggregate_round(N, subs, range(N), z=z, rng=np.random.default_rng(0), **kw)
    g = round_mechanism(varphi, S=S, q=q, z=z, M=M).granularity
    np.testing.assert_array_equal(nobody / g, everyone / g - np.rint(full / g))


def test_aggregate_refuses_bad_input() -> None:
    kw: dict[str, Any] = {"M": 2, "P": 2, "S": 1.0, "q": 0.5, "z": 1.0, "temperature": 1.0}
    kw["rng"] = np.random.default_rng(0)
    with pytest.raises(InputDataError, match="length 2"):
        aggregate_round(3, {0: [1.0, 2.0, 3.0]}, [0], **kw)
    with pytest.raises(InputDataError, match="lie in"):
        aggregate_round(3, {5: [1.0, 2.0]}, [0], **kw)
    with pytest.raises(InputDataError, match="finite"):
        aggregate_round(3, {0: [np.nan, 2.0]}, [0], **kw)


def test_production_noise_comes_from_a_fresh_os_keyed_generator() -> None:
    args = (4, {0: [1.0, 0.0, 0.0]}, [0])
    kw: dict[str, Any] = {"M": 3, "P": 2, "S": 1.0, "q": 0.5, "z": 1.0, "temperature": 1.0}
    out, again = aggregate_round(*args, **kw), aggregate_round(*args, **kw)
    assert out.shape == (2, 3) and np.isfinite(out).all() and not np.array_equal(out, again)


def test_poisson_subsampling_rate_binomial_test_with_control() -> None:
    N, q = 20_000, 0.3
    mask = poisson_sample(N, q, rng=np.random.default_rng(14))
    k = int(mask.sum())
    assert stats.binomtest(k, N, q).pvalue > 1e-6
    assert stats.binomtest(k, N, 0.32).pvalue < 1e-6  # control: a 2-point error in q is caught
    # independence: over 400 rounds of 50 agents, each agent's inclusion count is Binomial(400, q)
    rounds = np.stack([poisson_sample(50, q, rng=np.random.default_rng(1000 + t)) for t in range(400)])
    counts = rounds.sum(0)
    dispersion = float(((counts - 400 * q) ** 2).sum() / (400 * q * (1 - q)))  # ~ chi^2_50
    assert 1e-6 < stats.chi2.sf(dispersion, 50) < 1 - 1e-6


def test_temperature_schedule_and_softmax_weights() -> None:
    sched = TemperatureSchedule(hold=10, growth=0.5, uniform_from=40)
    assert [sched.temperature(t) for t in (0, 9, 10, 12, 39, 40)] == [1.0, 1.0, 1.0, 2.0, 15.5, math.inf]
    assert TemperatureSchedule.from_public(json.loads(json.dumps(sched.to_public()))) == sched
    w = softmax_weights(round_robin(8, 4), 4, 1.0)
    np.testing.assert_allclose(w.sum(1), 1.0)
    assert w[0, 0] == pytest.approx(math.exp(15) / (2 * math.exp(15) + 6))
    np.testing.assert_allclose(softmax_weights(round_robin(8, 4), 4, math.inf), 1 / 8)
    with pytest.raises(InputDataError, match="temperature"):
        softmax_weights(round_robin(8, 4), 4, 0.5)


# ------------------------------------------------------------------------------- agent, Algorithm 2


def test_p_t_schedules() -> None:
    assert p_t(4, "inv_sqrt") == pytest.approx(0.5)
    assert p_t(4, "inv") == pytest.approx(0.75)
    assert p_t(4, "constant", constant=0.2) == 0.2
    with pytest.raises(InputDataError):
        p_t(0)


def test_initial_points_lie_in_the_assigned_region() -> None:
    R = split_box([0, 0], [2, 2], 4)
    pts = initial_points(R, 3, 10, rng=np.random.default_rng(15))
    assert pts.shape == (10, 2) and (R.region_of(pts) == 3).all()


def test_piecewise_argmax_matches_a_dense_grid() -> None:
    rng = np.random.default_rng(16)
    rff = draw_rff(2, 60, 0.25, rng=rng)
    R = split_box([0, 0], [1, 1], 4)
    omegas = rng.standard_normal((4, 60))
    x, v = maximize_rff(rff, omegas, R, rng=np.random.default_rng(17), n_candidates=512, n_starts=5)
    g = np.stack(np.meshgrid(np.linspace(0, 1, 301), np.linspace(0, 1, 301)), -1).reshape(-1, 2)
    grid_vals = np.einsum("km,km->k", rff.features(g), omegas[R.region_of(g)])
    assert v == pytest.approx(float(rff.features(x)[0] @ omegas[R.region_of(x)[0]]))
    assert v >= grid_vals.max() - 1e-3


def test_choose_query_uses_aggregates_or_local_ts_by_p_t() -> None:
    rng = np.random.default_rng(18)
    rff = draw_rff(2, 40, 0.3, rng=rng)
    R = split_box([0, 0], [1, 1], 2)
    X = initial_points(R, 0, 5, rng=rng)
    y = -np.sum((X - 0.7) ** 2, axis=1)
    agg = np.stack([agent_submission(rff, X, y, rng=rng)] * 2)
    first = choose_query(1, rff, X, y, agg, R, rng=rng, schedule="inv_sqrt")  # p_1 = 0: aggregates
    assert first.source == "aggregate" and first.p_t == 0.0
    x_best, _ = maximize_rff(rff, agg, R, rng=np.random.default_rng(0))
    assert float(rff.features(first.x)[0] @ agg[0]) >= float(rff.features(x_best)[0] @ agg[0]) - 1e-2
    local = choose_query(5, rff, X, y, agg, R, rng=rng, schedule="constant", constant=1.0)
    assert local.source == "local"
    assert choose_query(5, rff, X, y, None, R, rng=rng, schedule="constant", constant=0.0).source == "local"


# ------------------------------------------------------------------------------------- accounting

PAPER_FIG_2C = {0.15: 5.93, 0.25: 9.91, 0.5: 20.12}  # moments accountant, z = 1, T = 40, N = 200


def _direct(q: float, z: float, rounds: int, delta: float, acc: str, rel: object) -> float:
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), rounds
    )
    if acc == "pld":
        a = pld_privacy_accountant.PLDAccountant(rel)
    else:
        a = rdp_privacy_accountant.RdpAccountant(RDP_ORDERS, rel)
    a.compose(event)
    return float(a.get_epsilon(delta))


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_federated_epsilon_against_dp_accounting_and_the_paper(accountant: str) -> None:
    q, z, T, delta = 0.25, 1.0, 40, 200**-1.1
    rel = dp_accounting.NeighboringRelation.REPLACE_SPECIAL
    ours = federated_epsilon(q, z, T, delta, accountant=accountant)  # type: ignore[arg-type]
    assert ours == pytest.approx(_direct(q, z, T, delta, accountant, rel), rel=1e-9)
    assert ours < PAPER_FIG_2C[q]  # the moments accountant is an upper bound; ours is tighter
    assert federated_epsilon(q, z, 0, delta) == 0.0
    with pytest.raises(InputDataError, match="accountant"):
        federated_epsilon(q, z, 1, delta, accountant="gdp")  # type: ignore[arg-type]


def test_replace_one_epsilon_is_larger_and_matches_dp_accounting() -> None:
    q, z, T, delta = 0.35, 1.0, 10, 1e-5
    zero_out = federated_epsilon(q, z, T, delta)
    replace = federated_epsilon_replace_one(q, z, T, delta)
    assert replace == pytest.approx(
        _direct(q, z, T, delta, "pld", dp_accounting.NeighboringRelation.REPLACE_ONE)
    )
    assert zero_out < replace < 2 * zero_out + 1e-9
    assert federated_epsilon_replace_one(q, z, T, delta, "rdp") >= replace


# --------------------------------------------------------------------- exact one-round privacy loss


def test_frozen_rule_exact_delta_matches_the_accountant_and_numerical_integration() -> None:
    cmp = compare_rules()  # N = 29, P = 4, M = 100, q = 0.35, z = 1, delta = 1e-5
    assert 0.9 * cmp.delta_target <= cmp.delta_frozen <= cmp.delta_target
    assert cmp.delta_accountant == pytest.approx(cmp.delta_target, rel=1e-3)
    # the closed form against numerical integration of max(0, p - e^eps q') in both directions
    q, s, eps = 0.35, 1.0, cmp.epsilon_claimed

    def p(x: float) -> float:
        return (1 - q) * stats.norm.pdf(x) + q * stats.norm.pdf(x - s)

    def hs(f, g) -> float:  # type: ignore[no-untyped-def]
        return integrate.quad(
            lambda x: max(0.0, f(x) - math.exp(eps) * g(x)), -40, 40, points=[0, 5], limit=400
        )[0]

    numeric = max(hs(p, stats.norm.pdf), hs(stats.norm.pdf, p))
    assert cmp.delta_frozen == pytest.approx(numeric, rel=1e-4)
    # the renormalised (paper-as-written) rule leaks almost surely after one round at the same epsilon
    assert cmp.delta_renormalised >= 0.89  # 0.895 at delta = 1e-5 (M = 100)
    paper_delta = compare_rules(delta=29**-1.1)  # the paper's delta = 1/N^1.1
    assert paper_delta.delta_renormalised >= 0.93  # 0.959
    assert paper_delta.delta_frozen <= paper_delta.delta_target


def test_scale_hockey_stick_against_numerical_integration() -> None:
    dim, eps, r = 400, 3.1, 7 / 6
    closed = _scale_hockey_stick(dim, np.array([1.0, r]), np.array([r, 1.0]), eps)

    def f(v: float, s: float) -> float:  # density of ||y||^2 under N(0, s^2 I_dim)
        return float(stats.chi2.pdf(v / s**2, dim) / s**2)

    for j, (s1, s2) in enumerate(((1.0, r), (r, 1.0))):
        num = integrate.quad(
            lambda v: max(0.0, f(v, s1) - math.exp(eps) * f(v, s2)), 0, 2000, points=[400, 544], limit=400
        )[0]
        assert closed[j] == pytest.approx(num, rel=1e-5)
    # uniform weights (T = inf): removing one of 29 changes varphi_max from 1/29 to 1/28 -- still detectable
    assert renormalised_round_delta(29, 4, 100, 0.35, 1.0, 3.1, temperature=math.inf) > frozen_round_delta(
        0.35, 1.0, 3.1
    )
