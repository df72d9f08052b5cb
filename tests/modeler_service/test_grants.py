"""The grant checks made when a study is created (``modeler_service.grants``), strategy by strategy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from modeler_service.grants import fit_to_grant, grant_problem, needs_grant
from shared.bo.strategies import Answer, get_strategy, parse_params
from shared.errors import InputDataError, StrategyError
from shared.privacy.ctl import CTL
from shared.protocol.schemas import OutputPrivacyPublic

OP = {"epsilon": 1.0, "B": 1.0, "R": 0.5}
CHARGE = CTL(**OP).charged_epsilon


def grant(fresh: bool = False, cap: float | None = None, **changes: float) -> OutputPrivacyPublic:
    op = OP | changes
    ctl = CTL(**op)
    return OutputPrivacyPublic(
        **op,
        fresh_repeats=fresh,
        max_epsilon_per_row=cap,
        store_raw=False,
        clip=ctl.bound,
        laplace_scale=ctl.scale,
        charged_epsilon=ctl.charged_epsilon,
    )


def problem(name: str, g: OutputPrivacyPublic | None, budget: int = 40, **params: object) -> str | None:
    strategy = get_strategy(name)
    return grant_problem(strategy, parse_params(name, params), budget, g)


def test_which_strategies_read_the_grant() -> None:
    for name, params, expected in [
        ("gp-ucb", {}, False),
        ("tgp-ucb", {"B": 1.0, "v": 2.0}, False),
        ("moma-gp-ucb", {"B": 1.0, "v": 2.0, "k": 4}, True),  # repeated plays
        ("ldp-tgp-ucb", OP, True),
        ("ldp-tgp-ucb", {}, True),  # epsilon, B, R left out: taken from the grant
        ("ldp-moma-gp-ucb", {**OP, "k": 4}, True),
    ]:
        strategy = get_strategy(name)
        assert needs_grant(strategy, parse_params(name, params), 40) is expected, name


def test_ldp_strategies_need_the_grants_ctl_parameters() -> None:
    assert problem("ldp-tgp-ucb", grant(), **OP) is None
    assert "'tgp-ucb'" in (problem("ldp-tgp-ucb", None, **OP) or "")
    mismatch = problem("ldp-tgp-ucb", grant(B=2.0), **OP) or ""
    assert "differ from the curator's grant" in mismatch and "B = 1 differ" in mismatch
    # left out, the grant's values are taken; given and equal, they stand; only a given value can differ
    assert problem("ldp-tgp-ucb", grant(B=2.0)) is None
    assert problem("ldp-tgp-ucb", grant(), epsilon=1.0) is None
    assert "'tgp-ucb'" in (problem("ldp-tgp-ucb", None) or "")


@pytest.mark.parametrize("name", ["gp-ucb", "gp-bucb"])
def test_gp_ucbs_noise_floor_is_the_grants_output_noise_unless_given(name: str) -> None:
    strategy = get_strategy(name)
    bare = parse_params(name, {})
    fitted = fit_to_grant(strategy, bare, grant(B=2.0))
    scale = CTL(epsilon=1.0, B=2.0, R=0.5).scale  # Laplace of scale 2 (B + R) / epsilon: variance 2 b^2
    assert fitted.model_dump()["noise_variance_floor"] == pytest.approx(2 * scale**2, rel=1e-15)
    assert fit_to_grant(strategy, bare, None) is bare  # no output privacy: no floor
    given = parse_params(name, {"noise_variance_floor": 0.25})
    assert fit_to_grant(strategy, given, grant()) is given  # the study's value stands
    assert not needs_grant(strategy, bare, 40)  # nothing to check against the grant


def test_ldp_parameters_left_out_are_the_grants_and_are_recorded() -> None:
    strategy = get_strategy("ldp-tgp-ucb")
    bare = parse_params("ldp-tgp-ucb", {"beta_multiplier": 0.1})
    assert strategy.output_privacy(bare) == (None, None, None)
    fitted = fit_to_grant(strategy, bare, grant(B=2.0))
    assert strategy.output_privacy(fitted) == (1.0, 2.0, 0.5)
    assert fitted.model_dump(mode="json")["B"] == 2.0 and fitted.beta_multiplier == 0.1  # type: ignore[attr-defined]
    partly = parse_params("ldp-tgp-ucb", {"R": 0.5})
    assert strategy.output_privacy(fit_to_grant(strategy, partly, grant())) == (1.0, 1.0, 0.5)
    # without the modeler (no grant read), the strategy cannot run on missing values: an actionable error
    with pytest.raises(InputDataError, match="come from the curator's grant"):
        strategy(
            np.zeros((3, 1)), bare, strategy.initial_state(bare, n=3, budget=2, rng=np.random.default_rng(0))
        )


def test_moma_needs_k_fresh_answers_within_the_cap() -> None:
    params = {**OP, "k": 4}
    assert problem("ldp-moma-gp-ucb", grant(fresh=True, cap=4 * CHARGE), **params) is None
    assert problem("ldp-moma-gp-ucb", grant(fresh=True, cap=None), **params) is None
    cached = problem("ldp-moma-gp-ucb", grant(), **params) or ""
    assert "fresh_repeats is false" in cached and f"{4 * CHARGE:.6g}" in cached
    tight = problem("ldp-moma-gp-ucb", grant(fresh=True, cap=3 * CHARGE), **params) or ""
    assert "set strategy_params.k to at most 3" in tight
    # a raw grant answers every play afresh (its outcomes are unprotected anyway): MoMA may run on it
    assert problem("moma-gp-ucb", None, B=1.0, v=2.0, k=4) is None


@pytest.mark.parametrize("budget", [40, 1000])
def test_k_theory_is_the_papers_and_is_checked_against_the_grant(budget: int) -> None:
    strategy = get_strategy("ldp-moma-gp-ucb")
    k = strategy.fresh_plays_per_row(parse_params("ldp-moma-gp-ucb", {**OP, "k": "theory"}), budget=budget)
    assert k == math.ceil(24 * math.log(4 * math.e * budget / 0.05))
    tight = (
        problem("ldp-moma-gp-ucb", grant(fresh=True, cap=(k - 1) * CHARGE), budget, **OP, k="theory") or ""
    )
    assert f"set strategy_params.k to at most {k - 1}" in tight


def test_moma_takes_its_per_row_limit_from_the_grant() -> None:
    params = parse_params("ldp-moma-gp-ucb", {**OP, "k": 4})
    moma, tgp_ = get_strategy("ldp-moma-gp-ucb"), get_strategy("ldp-tgp-ucb")
    fitted = fit_to_grant(moma, params, grant(fresh=True, cap=10 * CHARGE))
    assert fitted.max_plays_per_row == 10 and fitted.k == 4  # type: ignore[attr-defined]
    assert fit_to_grant(moma, params, grant(fresh=True)).max_plays_per_row is None  # type: ignore[attr-defined]
    given = parse_params("ldp-moma-gp-ucb", {**OP, "k": 4, "max_plays_per_row": 6})
    kept = fit_to_grant(moma, given, grant(fresh=True, cap=10 * CHARGE))
    assert kept.max_plays_per_row == 6  # type: ignore[attr-defined]  # the study's value stands
    tgp = parse_params("ldp-tgp-ucb", OP)  # no per-row limit to fill: only what a fresh grant allows
    assert fit_to_grant(tgp_, tgp, grant(fresh=True, cap=3)).model_dump() == tgp.model_dump() | {
        "exclude_queried": False
    }


def test_moma_never_plans_a_row_past_its_limit() -> None:
    rng = np.random.default_rng(0)
    Z = np.linspace(0, 1, 5)[:, None]
    params = parse_params("ldp-moma-gp-ucb", {**OP, "k": 2, "max_plays_per_row": 2, "lengthscale": 10.0})
    cls = get_strategy("ldp-moma-gp-ucb")
    strategy = cls(Z, params, cls.initial_state(params, n=5, budget=10, rng=rng))
    seen: list[int] = []
    for _ in range(5):
        plan = strategy.plan(budget=2, rng=rng)
        assert len({r.index for r in plan}) == 1 and plan[0].index not in seen
        seen.append(plan[0].index)
        strategy.observe([Answer(r, 1.0) for r in plan])  # flat answers: UCB would replay a row
    assert sorted(seen) == list(range(5))
    with pytest.raises(StrategyError, match="max_plays_per_row"):
        strategy.plan(budget=2, rng=rng)


@pytest.mark.parametrize("name", ["tgp-ucb", "ldp-tgp-ucb", "ldp-ata-gp-ucb", "ldp-moma-gp-ucb"])
def test_a_row_is_played_again_only_where_the_grant_answers_a_repeat_afresh(name: str) -> None:
    """Issue 32, round 4: ``exclude_queried`` is filled (and so recorded) from the grant: a plain grant
    answers a repeat with the row's stored outcome, a cached one with its first noisy answer; only
    ``fresh_repeats`` gives a new one."""
    strategy = get_strategy(name)
    given = {"B": 1.0, "v": 2.0} if name == "tgp-ucb" else {"k": 2} if "moma" in name else {}
    params = parse_params(name, given)
    grants = [grant(fresh=True, cap=10 * CHARGE), grant()] + ([None] if name == "tgp-ucb" else [])
    filled = [fit_to_grant(strategy, params, g).model_dump()["exclude_queried"] for g in grants]
    assert filled == [False, True] + ([True] if name == "tgp-ucb" else [])
    chosen = parse_params(name, given | {"exclude_queried": False})
    assert fit_to_grant(strategy, chosen, grant()).model_dump()["exclude_queried"] is False
