"""The UCB acquisition written once in ``shared.bo.acquisition``: scores, choice and audit details."""

from __future__ import annotations

import math

import numpy as np

from shared.bo.acquisition import UCB, first_argmax, ucb_details, ucb_scores, ucb_value


def test_scores_are_mean_plus_scale_std() -> None:
    mean, std = np.array([0.0, 1.0, 2.0]), np.array([1.0, 0.5, 0.0])
    assert np.array_equal(ucb_scores(mean, std, 2.0), mean + 2.0 * std)
    assert ucb_value(1.0, 0.5, 2.0) == ucb_scores(mean, std, 2.0)[1]


def test_the_argmax_is_the_first_maximum() -> None:
    assert first_argmax(np.array([1.0, 3.0, 3.0, -np.inf])) == 1
    assert first_argmax(np.array([-np.inf, -np.inf])) == 0


def test_initial_rows_come_first_then_the_argmax_of_the_rows_not_excluded() -> None:
    ucb = UCB.of(np.array([0.0, 1.0, 2.0, 2.0]), np.ones(4), beta=4.0, scale=2.0)
    assert ucb.choose([3, 0], 1, "gp-ucb") == (0, "initial")
    assert ucb.choose([3, 0], 2, "gp-ucb") == (2, "gp-ucb")  # tie at 2 and 3: the smallest index
    ucb.exclude(np.array([False, False, True, False]))
    assert ucb.choose([], 0, "gp-ucb") == (3, "gp-ucb")
    ucb.exclude(np.array([3, 1]))
    assert ucb.argmax() == 0 and ucb.values[3] == -math.inf


def test_details_keep_the_audited_keys_in_order() -> None:
    ucb = UCB.of(np.array([0.5, 1.5]), np.array([0.25, 0.5]), beta=9.0, scale=3.0)
    details = ucb.details(1, source="tgp-ucb", t=2, lengthscale=0.3)
    assert list(details) == ["source", "acquisition", "beta", "mean", "std", "t", "lengthscale"]
    assert details == {
        "source": "tgp-ucb",
        "acquisition": 3.0,
        "beta": 9.0,
        "mean": 1.5,
        "std": 0.5,
        "t": 2,
        "lengthscale": 0.3,
    }
    assert all(type(details[k]) is float for k in ("acquisition", "beta", "mean", "std"))
    assert ucb_details(source="initial", acquisition=-math.inf, beta=1, mean=0.0, std=1.0)["beta"] == 1.0
