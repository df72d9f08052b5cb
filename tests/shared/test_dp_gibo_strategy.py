"""The ``dp-gibo`` strategy alone: the same choices as ``run_dp_gibo``, plan without side effects, the state
rebuilt from recorded rounds, Algorithm 2's batch size, theta inside the box."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest

from shared.bo.gibo.gp import GradientGP
from shared.bo.gibo.kernels import SEKernel
from shared.bo.gibo.loop import run_dp_gibo
from shared.bo.gibo.private_gradient import private_gradient
from shared.bo.gibo.updates import AdaGrad
from shared.bo.strategies import (
    REGISTRY,
    DPGIBOStrategy,
    GradientAnswer,
    GradientDomain,
    catalogue,
    default_lengthscale,
    get_strategy,
    gradient_answer_from_record,
    gradient_record,
    parse_params,
    round_rng,
)
from shared.errors import InputDataError, StrategyError

STAR = np.array([1.0, -0.5, 0.25])
DOMAIN = GradientDomain(dimension=3, bounds=((-2.0, 2.0), (-2.0, 2.0), (-1.0, 3.0)), steps=40)


def make(raw: dict[str, Any] | None = None, domain: GradientDomain = DOMAIN) -> DPGIBOStrategy:
    params = parse_params("dp-gibo", raw)
    DPGIBOStrategy.check_domain(params, domain, budget=10)
    return DPGIBOStrategy(domain, params, {})


def quadratic(theta: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(float(v) for v in np.asarray(theta) - STAR[: len(theta)])


def play(s: DPGIBOStrategy, rounds: int, seed: int = 1, scale: float = 1.0) -> list[list[GradientAnswer]]:
    """``rounds`` rounds, each answered with the exact gradient (times ``scale``), recorded as the modeler
    records them (``gradient_record`` through JSON, then ``gradient_answer_from_record``)."""
    history = []
    for k in range(rounds):
        (request,) = s.plan(budget=rounds - k, rng=round_rng(seed, k + 1))
        answer = GradientAnswer(request, tuple(scale * g for g in quadratic(request.theta)), k + 1)
        outcome = s.outcome([answer])
        record = json.loads(json.dumps(gradient_record(answer, outcome.details[0])))
        s.observe([answer])
        assert outcome.point == s.point()
        history.append([gradient_answer_from_record(record)])
    return history


def test_registered_as_a_gradient_oracle_strategy() -> None:
    assert get_strategy("dp-gibo") is DPGIBOStrategy and REGISTRY["dp-gibo"].runs_on == "gradient-oracle"
    entry = next(e for e in catalogue() if e["name"] == "dp-gibo")
    assert entry["kinds"] == ["gradient"] and entry["runs_on"] == "gradient-oracle"
    props = entry["params_schema"]["properties"]
    assert {
        "theta0",
        "kernel",
        "updater",
        "lr",
        "batch_size",
        "tolerance",
        "init_scale",
        "n_restarts",
    } <= set(props)
    assert all(e["runs_on"] == "release" for e in catalogue() if e["name"] != "dp-gibo")


def test_defaults() -> None:
    s = make()
    assert s.point() == (0.0, 0.0, 1.0)  # the box's centre
    assert s.kernel_spec == {
        "kind": "se",
        "lengthscale": pytest.approx(0.2 * 48**0.5),
        "signal_variance": 1.0,
    }
    assert default_lengthscale(DOMAIN.array()) == pytest.approx(0.2 * np.sqrt(16 + 16 + 16))
    assert isinstance(s.updater, AdaGrad) and s.updater.lr == pytest.approx(0.4)  # 0.1 x mean width 4
    (request,) = s.plan(budget=1, rng=round_rng(0, 1))
    assert len(request.points) == 4 == request.details["b"]  # b = d + 1
    assert request.details["algorithm"] == 1 and request.details["theta"] == [0.0, 0.0, 1.0]
    body = request.body()
    assert set(body) == {"theta", "points", "kernel", "noise_var", "jitter"}
    assert json.loads(json.dumps(body)) == body


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"batch_size": 2, "tolerance": 0.1}, ["not both"]),
        ({"kernel": {"kind": "matern"}}, ["kernel"]),
        ({"kernel": {"kind": "polynomial", "lengthscale": 1.0}}, ["lengthscale"]),
        ({"updater": "adam"}, ["updater"]),
        ({"lr": 0}, ["lr"]),
        ({"batch_size": 0}, ["batch_size"]),
    ],
)
def test_bad_params(raw: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(InputDataError) as info:
        parse_params("dp-gibo", raw)
    assert all(w in str(info.value) for w in words), str(info.value)


def test_theta0_must_fit_the_domain() -> None:
    with pytest.raises(InputDataError, match="theta0 has 2 entries"):
        make({"theta0": [0.0, 0.0]})
    with pytest.raises(InputDataError, match=r"theta0\[2\] = -3 lies outside"):
        make({"theta0": [0.0, 0.0, -3.0]})


def test_a_design_larger_than_the_curator_accepts_is_refused_at_creation() -> None:
    limited = GradientDomain(dimension=3, bounds=DOMAIN.bounds, steps=40, max_design=100)
    params = parse_params("dp-gibo", {})
    DPGIBOStrategy.check_domain(params, limited, budget=25)  # 25 steps x (d + 1 = 4) points = 100
    with pytest.raises(InputDataError, match="at most 100 over all steps: ask for at most 25 iterations"):
        DPGIBOStrategy.check_domain(params, limited, budget=26)
    small = parse_params("dp-gibo", {"batch_size": 2})
    DPGIBOStrategy.check_domain(small, limited, budget=40)


def test_plan_does_not_change_the_state_and_replans_identically() -> None:
    s = make({"batch_size": 2})
    play(s, 2)
    before = (s.point(), s.design.copy(), s.updater.to_state(), s.t)
    a = s.plan(budget=3, rng=round_rng(9, 3))
    b = s.plan(budget=3, rng=round_rng(9, 3))
    assert a == b
    assert (s.point(), s.updater.to_state(), s.t) == (before[0], before[2], before[3])
    np.testing.assert_array_equal(s.design, before[1])
    s.outcome([GradientAnswer(a[0], (1.0, 1.0, 1.0))])  # outcome does not change it either
    assert s.point() == before[0] and s.updater.to_state() == before[2]


@pytest.mark.parametrize(
    "raw",
    [
        {},
        {"batch_size": 1, "updater": "gd", "lr": 0.3},
        {"tolerance": 1e-3, "kernel": {"kind": "polynomial"}},
    ],
)
def test_from_history_equals_the_live_state(raw: dict[str, Any]) -> None:
    live = make(raw)
    history = play(live, 6)
    rebuilt = DPGIBOStrategy.from_history(DOMAIN, live.params, {}, history)
    assert rebuilt.point() == live.point() and rebuilt.t == live.t == 6
    np.testing.assert_array_equal(rebuilt.design, live.design)
    assert rebuilt.updater.to_state() == live.updater.to_state()
    assert rebuilt.plan(budget=1, rng=round_rng(4, 7)) == live.plan(budget=1, rng=round_rng(4, 7))


def test_from_history_refuses_a_log_that_does_not_replay() -> None:
    live = make()
    history = play(live, 2)
    other = parse_params("dp-gibo", {"lr": 0.05})  # a different update rule than the one recorded
    with pytest.raises(StrategyError, match="theta_next"):
        DPGIBOStrategy.from_history(DOMAIN, other, {}, history)
    with pytest.raises(StrategyError, match="was asked at theta"):
        DPGIBOStrategy.from_history(DOMAIN, live.params, {}, history[1:])


def test_moves_toward_the_minimiser() -> None:
    s = make()
    start = np.linalg.norm(np.asarray(s.point()) - STAR)
    play(s, 15)
    assert np.linalg.norm(np.asarray(s.point()) - STAR) < 0.1 * start


def test_adaptive_batch_is_at_most_d_plus_1() -> None:
    s = make({"tolerance": 1e-4})
    sizes = []
    for k in range(6):
        (request,) = s.plan(budget=1, rng=round_rng(2, k + 1))
        b = request.details["b"]
        assert 1 <= b <= DOMAIN.dimension + 1 and len(request.points) == b
        assert request.details["algorithm"] == 2 and "reached_tolerance" in request.details
        sizes.append(b)
        s.observe([GradientAnswer(request, quadratic(request.theta))])
    assert sizes[0] == DOMAIN.dimension + 1  # an empty design needs every point the first time
    loose = make({"tolerance": 1e6})
    assert loose.plan(budget=1, rng=round_rng(2, 1))[0].details["b"] == 1


def test_theta_stays_in_the_box() -> None:
    s = make({"updater": "gd", "lr": 10.0})
    play(s, 5, scale=100.0)  # huge steps: every update overshoots the box
    bd = DOMAIN.array()
    theta = np.asarray(s.point())
    assert ((theta >= bd[:, 0]) & (theta <= bd[:, 1])).all()
    for z in s.design:
        assert ((z >= bd[:, 0]) & (z <= bd[:, 1])).all()


def test_same_choices_as_run_dp_gibo() -> None:
    """The strategy, planning with one generator in order and answered by the oracle's arithmetic, walks
    exactly the path of ``shared.bo.gibo.loop.run_dp_gibo`` (Algorithm 1, then Algorithm 2)."""
    users = np.random.default_rng(0).normal(STAR, 0.3, size=(25, 3))

    def loss_matrix(Z: np.ndarray) -> np.ndarray:
        return 0.5 * ((Z[:, None, :] - users[None, :, :]) ** 2).sum(-1)  # [b, n]

    T, lr = 5, 0.3
    for rule in ({"batch_size": 2}, {"tolerance": 1e-3}):
        kernel = SEKernel(lengthscale=1.5)
        reference = run_dp_gibo(
            loss_matrix,
            [0.0, 0.0, 1.0],
            DOMAIN.array(),
            T=T,
            B=10.0,
            mu=math.inf,  # no noise: the paths must agree step for step
            kernel=kernel,
            updater=AdaGrad(lr=lr),
            rng=np.random.default_rng(11),
            **rule,  # type: ignore[arg-type]
        )
        s = make({**rule, "lr": lr, "kernel": {"kind": "se", "lengthscale": 1.5}})
        rng = np.random.default_rng(11)
        D = np.zeros((0, 3))
        for _ in range(T):
            (request,) = s.plan(budget=1, rng=rng)
            D = np.vstack([D, np.asarray(request.points)])
            W = GradientGP(kernel, D).grad_weights(np.asarray(request.theta))
            g = private_gradient(W, loss_matrix(D), B=10.0, T=T, mu=math.inf)
            s.observe([GradientAnswer(request, tuple(float(v) for v in g))])
        np.testing.assert_allclose(s.point(), reference.theta, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(s.design, reference.design, rtol=1e-12, atol=1e-12)
