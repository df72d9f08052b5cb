"""``Strategy.exclude_rows``: every registered row strategy never plans a row the modeler excluded (the rows a
curator grant can no longer answer), its initial rows included; with every row excluded it says so;
``posterior_mean`` is the model's estimate for strategies that keep one; and the heavy-tailed strategies'
``exclude_queried``, filled from how the grant answers a repeat."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from shared.bo.strategies import REGISTRY, Answer, Strategy, get_strategy, parse_params
from shared.errors import StrategyError

#: The parameters a strategy needs to be built without a grant (the LDP ones: the grant's CTL values).
NEEDS: dict[str, dict[str, Any]] = {
    "tgp-ucb": {"B": 1.0, "v": 2.0},
    "ata-gp-ucb": {"B": 1.0, "v": 2.0},
    "moma-gp-ucb": {"B": 1.0, "v": 2.0, "k": 2},
    "ldp-tgp-ucb": {"epsilon": 1.0, "B": 1.0, "R": 0.5},
    "ldp-ata-gp-ucb": {"epsilon": 1.0, "B": 1.0, "R": 0.5},
    "ldp-moma-gp-ucb": {"epsilon": 1.0, "B": 1.0, "R": 0.5, "k": 2},
}
ROW_STRATEGIES = sorted(name for name, cls in REGISTRY.items() if cls.runs_on == "release")


def build(name: str, Z: np.ndarray) -> Strategy[Any, Any, Any]:
    cls = get_strategy(name)
    params = parse_params(name, NEEDS.get(name, {}))
    state = cls.initial_state(params, n=Z.shape[0], budget=30, rng=np.random.default_rng(3))
    return cls(Z, params, state)


@pytest.mark.parametrize("name", ROW_STRATEGIES)
def test_excluded_rows_are_never_planned(name: str) -> None:
    rng = np.random.default_rng(11)
    Z = rng.standard_normal((40, 2))
    f = np.exp(-((Z - Z[5]) ** 2).sum(1))  # the optimum at row 5: excluded below, never chosen
    strategy = build(name, Z)
    first = [r.index for r in strategy.plan(budget=3, rng=np.random.default_rng(0))]
    blocked = np.zeros(40, dtype=bool)
    blocked[first] = True  # the first choice (an initial row, or the first argmax) is excluded ...
    blocked[5] = True
    blocked[20:] = True  # ... and half the rows
    strategy.exclude_rows(blocked)
    chosen: list[int] = []
    for round_no in range(5):  # at most 10 of the 17 rows left
        planned = strategy.plan(budget=2, rng=np.random.default_rng(round_no))
        assert planned and not blocked[[r.index for r in planned]].any(), (name, planned)
        chosen += [r.index for r in planned]
        strategy.observe([Answer(r, float(f[r.index])) for r in planned])
    assert chosen
    strategy.exclude_rows(None)  # lifted: every row may be chosen again
    assert strategy.unavailable is None


@pytest.mark.parametrize("name", ROW_STRATEGIES)
def test_every_row_excluded_is_a_strategy_error(name: str) -> None:
    strategy = build(name, np.random.default_rng(2).standard_normal((12, 2)))
    strategy.exclude_rows(np.ones(12, dtype=bool))
    with pytest.raises(StrategyError, match="excluded"):
        strategy.plan(budget=2, rng=np.random.default_rng(0))


def test_a_mask_of_the_wrong_size_is_refused() -> None:
    strategy = build("gp-ucb", np.zeros((5, 1)) + np.arange(5)[:, None])
    with pytest.raises(ValueError, match="mask over the 5 rows"):
        strategy.exclude_rows(np.ones(4, dtype=bool))


@pytest.mark.parametrize("name", ["gp-ucb", "ldp-tgp-ucb", "ldp-ata-gp-ucb", "ldp-moma-gp-ucb"])
def test_posterior_mean_follows_the_answers(name: str) -> None:
    Z = np.linspace(0, 4, 30)[:, None]
    strategy = build(name, Z)
    assert strategy.posterior_mean(7) == pytest.approx(0.0, abs=1e-9)  # the prior mean
    for _ in range(3):
        planned = strategy.plan(budget=2, rng=np.random.default_rng(0))
        strategy.observe([Answer(r, 0.8) for r in planned])
    played = planned[0].index
    estimate = strategy.posterior_mean(played)
    assert estimate is not None and 0.0 < estimate < 1.0  # pulled towards the answers, shrunk by the prior
    assert build("random", Z).posterior_mean(3) is None


HEAVY_TAILED = sorted(name for name in NEEDS)


def _plays(name: str, exclude: bool | None, epochs: int = 12) -> list[int]:
    """The rows a heavy-tailed strategy plays on a peaked f (its optimum row 5), one per choice (an epoch for
    MoMA), with ``exclude_queried`` as given."""
    Z = np.linspace(0.0, 4.0, 40)[:, None]
    f = 3.0 * np.exp(-((Z[:, 0] - Z[5, 0]) ** 2) / 0.05)
    raw = NEEDS[name] | {"lengthscale": 0.3} | ({} if exclude is None else {"exclude_queried": exclude})
    cls = get_strategy(name)
    params = parse_params(name, raw)
    state = cls.initial_state(params, n=40, budget=200, rng=np.random.default_rng(3))
    strategy = cls(Z, params, state)
    chosen: list[int] = []
    for round_no in range(epochs):
        planned = strategy.plan(budget=200, rng=np.random.default_rng(round_no))
        chosen.append(planned[0].index)
        strategy.observe([Answer(r, float(f[r.index])) for r in planned])
    return chosen


@pytest.mark.parametrize("name", HEAVY_TAILED)
def test_with_exclude_queried_a_row_is_chosen_once(name: str) -> None:
    """Issue 32, round 4: under a grant whose repeats are not fresh a heavy-tailed strategy never chooses a
    row it has played (MoMA: in an earlier epoch); the papers' algorithm (false) comes back to the best
    row."""
    once = _plays(name, True)
    assert len(set(once)) == len(once), once
    again = _plays(name, False)
    assert len(set(again)) < len(again), again
    assert _plays(name, None) == again  # left out, outside the modeler: the papers' algorithm


@pytest.mark.parametrize("name", HEAVY_TAILED)
def test_exclude_queried_is_filled_from_how_the_grant_answers_a_repeat(name: str) -> None:
    cls = get_strategy(name)
    params = parse_params(name, NEEDS[name])
    assert cls.with_answers(params, fresh_repeats=False).model_dump()["exclude_queried"] is True
    assert cls.with_answers(params, fresh_repeats=True).model_dump()["exclude_queried"] is False
    given = parse_params(name, NEEDS[name] | {"exclude_queried": False})
    assert cls.with_answers(given, fresh_repeats=False) is given  # the study's value stands
    gp = parse_params("gp-ucb", {})
    assert get_strategy("gp-ucb").with_answers(gp, fresh_repeats=True) is gp  # its own default: true
