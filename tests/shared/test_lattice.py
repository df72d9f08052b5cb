"""The exact lattice mechanism (``shared.privacy.lattice``): numpy's sampler as the analysis describes it, the
dither that makes its sparse tail harmless, the margins that follow, and exact sums.

numpy's ``standard_normal`` is fed chosen 64-bit words (``randomgen.UserBitGenerator``), so these tests pin
the sampler's values the margins rely on: a change of numpy's algorithm fails here instead of the claim.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from randomgen import UserBitGenerator
from scipy import optimize, stats

from shared.errors import InputDataError
from shared.privacy.lattice import (
    DITHER_WIDTH,
    TAIL_SLACK,
    WINDOW_BITS,
    ZIGGURAT_R,
    check_sampler_margins,
    dense_until,
    exact_sum,
    lattice_gaussian,
    lattice_noise,
    sampler_margins,
    sum_slack,
)

R = ZIGGURAT_R
TWO53 = 2**53


class ChosenBits:
    """A numpy Generator whose bit generator returns the queued 64-bit words, in order."""

    def __init__(self) -> None:
        self.words: list[int] = []
        self.starved = False
        self.generator = np.random.Generator(UserBitGenerator(self._next, 64))

    def _next(self, _state: object) -> int:
        if not self.words:  # (an exception cannot cross the C callback) a word that ends the draw at once
            self.starved = True
            return 1
        return self.words.pop(0)

    def feed(self, *words: int) -> np.random.Generator:
        self.words[:] = list(words)
        self.starved = False
        return self.generator


def tail_words(j: int) -> tuple[int, int, int]:
    """The words for numpy's tail branch with 1 - U1 = j 2^-53 and the acceptance draw U2 = 1 - 2^-53.

    Word 1: layer 0 (low 8 bits), then a sign bit, then rabs = 2^52 - 1 >= ki[0] (the tail branch); the
    sign of the result is bit 8 of rabs (set: negative). Words 2, 3: next_double = (word >> 11) 2^-53.
    """
    return ((1 << 52) - 1) << 9, (TWO53 - j) << 11, (TWO53 - 1) << 11


def tail_value(bits: ChosenBits, j: int) -> float:
    value = float(bits.feed(*tail_words(j)).standard_normal())
    assert not bits.words and not bits.starved
    return value


def marsaglia(j: int) -> float:
    """What the analysis says numpy's tail value for j is: r + (53 ln 2 - ln j) / r."""
    return R + (53 * math.log(2.0) - math.log(j)) / R


# ------------------------------------------------------------------------------------- numpy's sampler


@pytest.mark.parametrize("j", [225, 1000, 2**20, 2**40])
def test_numpys_tail_values_are_r_plus_53_ln2_minus_ln_j_over_r(j: int) -> None:
    bits = ChosenBits()
    assert tail_value(bits, j) == pytest.approx(-marsaglia(j), rel=1e-14)


def test_numpy_rejects_every_tail_value_beyond_12_23_sigma() -> None:
    """Accepted iff 2 yy > xx^2 with yy <= 53 ln 2: xx <= sqrt(106 ln 2) = 8.572, |N| <= r + 8.572 = 12.226.
    j = 224 is just beyond (rejected: numpy draws again, here j = 2^40); j = 225 just inside."""
    bits = ChosenBits()
    limit = R + math.sqrt(106 * math.log(2.0))
    assert marsaglia(225) < limit < marsaglia(224)
    assert -tail_value(bits, 225) == pytest.approx(marsaglia(225), rel=1e-14)
    again = tail_words(2**40)[1:]
    value = bits.feed(*tail_words(224), *again).standard_normal()
    assert not bits.words and not bits.starved and -value == pytest.approx(marsaglia(2**40), rel=1e-14)


@pytest.mark.parametrize("b", [WINDOW_BITS[0], 24, 30, WINDOW_BITS[-1]])
def test_within_dense_until_every_dither_window_holds_2_to_the_b_sampler_values(b: int) -> None:
    """The outermost window [x - w, x] at x = dense_until(b) holds the values of j = J .. J + 2^b (numpy's
    tail values decrease in j, so every value in between too); windows nearer the mean hold more."""
    bits = ChosenBits()
    x = dense_until(b)
    J = math.ceil(TWO53 * math.exp(-(x - R) * R))
    outer, inner = -tail_value(bits, J), -tail_value(bits, J + 2**b)
    assert outer <= x + 1e-9
    assert outer - inner <= DITHER_WIDTH


def test_the_body_of_the_ziggurat_is_denser_than_any_window_the_analysis_uses() -> None:
    """In the body the values are rabs x wi[idx]: consecutive ones lie wi[idx] apart, for every layer far less
    than w / 2^44 (the largest K the margins take, WINDOW_BITS). (Layer 1 always runs its wedge test: the
    second word, a uniform 0, accepts.)"""
    bits = ChosenBits()
    spacing = []
    for idx in range(256):
        spacing.append(abs(float(bits.feed((1 << 9) | idx, 0).standard_normal())))
        assert not bits.starved
    assert 0 < max(spacing) <= DITHER_WIDTH * 2.0 ** -max(WINDOW_BITS)


def test_without_the_dither_a_tail_cell_is_unreachable_with_it_reachable() -> None:
    """At sigma / g = 2^25, numpy's tail values near 9.9 sigma lie ~9 cells apart: rint(N / g) never lands on
    the cells in between, under one mean, though it can under a neighbour's mean one cell away. The dither
    reaches them: with a chosen dither, the cell between two consecutive values comes out."""
    bits = ChosenBits()
    steps = 2.0**25
    j = 2**20
    here, next_value = tail_value(bits, j), tail_value(bits, j + 1)
    cells = round(here * steps), round(next_value * steps)
    assert abs(cells[0] - cells[1]) >= 8  # consecutive values: the cells between them are never hit
    target = (cells[0] + cells[1]) // 2
    width = DITHER_WIDTH * steps
    u = (target - here * steps + 0.5 * width) / width  # the dither that moves N onto the target cell
    words = (*tail_words(j), int(u * TWO53) << 11)
    noise = lattice_noise((1,), steps, bits.feed(*words))
    assert not bits.words and not bits.starved and noise[0] == target


def test_the_dither_adds_w2_over_12_to_the_variance() -> None:
    rng = np.random.default_rng(31)
    steps = 1000.0
    noise = lattice_noise((400_000,), steps, rng) / steps
    assert noise.var() == pytest.approx(1 + DITHER_WIDTH**2 / 12, rel=0.01)
    assert stats.kstest(noise, "norm").pvalue > 1e-6


# ------------------------------------------------------------------------------------------------ margins


def test_the_margins_are_what_the_docstring_says() -> None:
    m = sampler_margins(50, 3.0, 1e-6, draws=4)
    assert m.epsilon == 50 * 4 * 8 / 2.0**m.window_bits
    assert m.delta <= 1e-6 / 1024  # the largest K with delta margin <= delta / 1024
    assert sampler_margins(50, 3.0, 1e-6, draws=4, window_bits=m.window_bits + 1).delta > 1e-6 / 1024
    # never below the unshifted tails of every entry
    t = dense_until(m.window_bits) - DITHER_WIDTH
    assert m.delta >= TAIL_SLACK * 50 * 4 * 2 * stats.norm.sf(t)
    assert m.ideal_delta(1e-6) == pytest.approx((1e-6 - m.delta) * math.exp(-m.epsilon / 2), rel=1e-15)


def test_less_noise_more_entries_and_more_draws_widen_the_delta_margin() -> None:
    def delta(entries: int, z: float, draws: int) -> float:
        return sampler_margins(entries, z, 1e-6, draws, window_bits=24).delta

    assert delta(10, 0.5, 1) > delta(10, 1.0, 1) > delta(10, 4.0, 1)
    assert delta(100, 1.0, 1) > delta(10, 1.0, 1)
    assert delta(10, 1.0, 30) == pytest.approx(30 * delta(10, 1.0, 1), rel=1e-12)


@pytest.mark.parametrize(("entries", "z"), [(1, 0.3), (3, 0.25), (8, 0.4), (20, 0.5)])
def test_the_spread_bound_covers_the_worst_move_of_norm_1_over_z(entries: int, z: float) -> None:
    """sum_j 2 Phi(-(t - Delta_j)) over ||Delta|| <= 1/z, maximised numerically (many starts), never exceeds
    what ``sampler_margins`` charges for it (its own tails subtracted)."""
    b = 24
    t = dense_until(b) - DITHER_WIDTH
    own_tails = entries * 2 * stats.norm.sf(t)
    charged = sampler_margins(entries, z, 1.0, window_bits=b).delta / TAIL_SLACK - own_tails

    def minus_spread(u: np.ndarray) -> float:
        shift = np.abs(u) / max(np.linalg.norm(u), 1e-300) / z  # on the sphere of radius 1/z
        return -float(np.sum(2 * stats.norm.sf(t - shift)))

    rng = np.random.default_rng(5)
    starts = [np.eye(entries)[0], np.ones(entries), *rng.random((20, entries))]
    worst = max(-optimize.minimize(minus_spread, s, method="Nelder-Mead").fun for s in starts)
    assert worst <= charged * (1 + 1e-9)
    assert worst >= charged / 64  # and the bound is not vacuous


def test_claims_the_margins_would_eat_are_refused_with_what_to_change() -> None:
    with pytest.raises(InputDataError, match=r"delta = 1e-12 is too small .* Choose a larger delta"):
        check_sampler_margins(10.0, 1e-12, 50, 0.1)
    with pytest.raises(InputDataError, match=r"epsilon = 1e-09 is too small .* choose epsilon >="):
        check_sampler_margins(1e-9, 1e-5, 10**6, 3.0)
    assert check_sampler_margins(1.0, 1e-5, 50, 3.0).delta <= 1e-5 / 1024


def test_a_lattice_coarser_than_the_dither_is_refused() -> None:
    """The margins assume a cell no wider than w sigma: a value bound that would force one is refused."""
    with pytest.raises(InputDataError, match="add noise"):
        lattice_gaussian(1e-20, 1.0, 3, value_bound=1e6)
    assert lattice_gaussian(1.0, 1.0, 3, value_bound=1e6).steps >= 1 / DITHER_WIDTH


# ------------------------------------------------------------------------------------------- exact sums


def test_an_exact_sum_does_not_depend_on_the_order_of_the_rows() -> None:
    """A float sum's rounding depends on the order (the control); the integer sum of snapped rows does not."""
    rng = np.random.default_rng(2)
    rows = rng.choice([1.0, -1.0], size=(4096, 3)) * 10.0 ** rng.uniform(-12, 0, size=(4096, 3))
    perm = rng.permutation(4096)
    floats = [np.add.reduce(rows[p], axis=0) for p in (np.arange(4096), perm, perm[::-1])]
    assert any(not np.array_equal(floats[0], f) for f in floats[1:])  # control: float sums differ
    exact = [exact_sum(rows[p], bound=1.0).value for p in (np.arange(4096), perm, perm[::-1])]
    assert all(np.array_equal(exact[0], e) for e in exact[1:])


@pytest.mark.parametrize("mean", [False, True])
def test_one_rows_change_moves_an_exact_sum_by_its_own_change_plus_the_slack(mean: bool) -> None:
    rng = np.random.default_rng(4)
    n, d, bound = 5000, 4, 2.0
    rows = rng.uniform(-bound, bound, size=(n, d))
    for _ in range(50):
        changed = rows.copy()
        i = int(rng.integers(n))
        changed[i] = rng.uniform(-bound, bound, size=d)
        after, before = (exact_sum(x, bound, mean=mean).value for x in (changed, rows))
        moved = np.linalg.norm(after - before)
        own = np.linalg.norm(changed[i] - rows[i]) / (n if mean else 1)
        assert moved <= own + sum_slack(n, bound, d, mean=mean)
