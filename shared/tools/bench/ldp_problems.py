"""The problems of ``pobo bench ldp`` (``shared.tools.bench.ldp``): the LDP-BO paper's synthetic functions,
its noise models, the CTL output mechanism as simulated here, and the "combined" problem on pobo's own grid.

Zhou & Tan, "Local Differential Privacy for Bayesian Optimization" (AAAI 2021), Section 5.1, "Synthetic data"
(the setting of Chowdhury & Gopalan, NeurIPS 2019, and their public code)::

    D   = {0.01, 0.02, ..., 1}                          100 arms on [0, 1] (d = 1)
    f   = sum_{j=1}^{100} w_j k(., s_j),  w_j ~ U[-1, 1],  s_j ~ U[0, 1]
    k   = SE, l = 0.2 ("se")  or  Matern nu = 2.5, l = 0.2 ("matern")
    B   = max_{x in D} |f(x)|                           (the paper's choice; a simulation only)
    y   = f(x) + eta,  eta ~ U[-1, 1] (R = 1)            the LDP case
    y   = f(x) + eta,  eta ~ Student-t(3 d.o.f.)          the non-private heavy-tailed case; v = B^2 + 3

(The paper's text draws the support points from D; the public code draws them uniformly on [0, 1]; the two
are the same function class and we follow the code.)

CTL(eps) is simulated with a seeded numpy generator: ``clip(y, -(B + R), B + R) + Laplace(2 (B + R) / eps)``,
clipped first exactly like ``shared.privacy.ctl.CTL``. Seeds are for benchmarks only: production answers go
through ``CTL.privatise``, OpenDP's discrete Laplace sampler seeded by the operating system.

Every random draw of a run is made up front (f, the noise of the t-th query, the standard Laplace draw of the
t-th query): every strategy of the run sees the same function and the same noise sequence (a paired design).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shared.privacy.ctl import CTL
from shared.privacy.gaussian import gaussian_release
from shared.tools.bench.synthetic import DELTA, LENGTHSCALE, _grid_factor, grid_inputs, sample_f

ARMS = 100
SUPPORT = 100
PAPER_LENGTHSCALE = 0.2
NOISE_BOUND = 1.0  # R: eta ~ U[-R, R]
STUDENT_T_DOF = 3
#: Combined setting: the input release's epsilon (delta = shared.tools.bench.synthetic.DELTA).
EPSILON_INPUT = 1.0
#: Combined setting: the declared bound on |f|, f standardised (units of sigma_y). A real curator declares B
#: from domain knowledge and never from the data (B = max |y| would publish the maximum); this is a
#: simulation, where B = 4 sigma_y is declared from f's scale. Outcomes beyond B + R are clipped by CTL.
COMBINED_B = 4.0

KERNEL_OF_SETTING = {"se": "se", "matern": "matern52", "student-t": "se"}


def domain() -> np.ndarray:
    """The 100 arms 0.01, 0.02, ..., 1 as an [100, 1] array."""
    return (np.arange(1, ARMS + 1, dtype=np.float64) / ARMS)[:, None]


def kernel_matrix(a: np.ndarray, b: np.ndarray, kernel: str, lengthscale: float) -> np.ndarray:
    """k(a_i, b_j) [len(a), len(b)] for 1-D points: SE ``exp(-r^2 / 2l^2)`` or Matern 5/2 (unit variance)."""
    r = np.abs(np.ravel(a)[:, None] - np.ravel(b)[None, :]) / lengthscale
    if kernel == "se":
        out: np.ndarray = np.exp(-0.5 * r * r)
    elif kernel == "matern52":
        s = math.sqrt(5.0) * r
        out = (1.0 + s + s * s / 3.0) * np.exp(-s)
    else:
        raise ValueError(f'kernel must be "se" or "matern52", got {kernel!r}')
    return out


def sample_paper_f(
    rng: np.random.Generator, kernel: str, lengthscale: float = PAPER_LENGTHSCALE
) -> np.ndarray:
    """f on the 100 arms: ``sum_j w_j k(., s_j)``, w_j ~ U[-1, 1], s_j ~ U[0, 1] (p = 100)."""
    w = rng.uniform(-1.0, 1.0, SUPPORT)
    s = rng.uniform(0.0, 1.0, SUPPORT)
    f: np.ndarray = kernel_matrix(domain(), s, kernel, lengthscale) @ w
    return f


@dataclass(frozen=True)
class Problem:
    """One run's problem: rows Z, f on them, bounds, the noise of the t-th query and the GP model's kernel."""

    setting: str
    Z: np.ndarray  # [n, d] the rows the strategies see
    f: np.ndarray  # [n]
    B: float  # bound on |f| given to the strategies and to CTL
    R: float | None  # bound on |eta| (None: unbounded, Student-t)
    eta: np.ndarray  # [T] noise of the t-th query
    laplace: np.ndarray  # [T] standard Laplace draw (scale 1) of the t-th query
    kernel: str  # "se" | "matern52"
    lengthscale: float
    noise_second_moment: float  # E[eta^2]: 1/3 for U[-1, 1], 3 for Student-t(3)
    extra: dict[str, float]

    @property
    def T(self) -> int:
        return int(self.eta.size)

    def outcomes(self, rows: np.ndarray, positions: np.ndarray, epsilon: float | None) -> np.ndarray:
        """y of the queries at ``positions`` (0-based query numbers) of ``rows``; CTL(epsilon) unless None."""
        y: np.ndarray = self.f[rows] + self.eta[positions]
        return y if epsilon is None else self.through_ctl(y, self.laplace[positions], epsilon)

    def through_ctl(self, y: np.ndarray, draws: np.ndarray, epsilon: float) -> np.ndarray:
        """CTL(epsilon)'s answers to outcomes ``y``, with ``draws`` the standard Laplace draws of its noise:
        clipped to +-(B + R), plus the draws times its Laplace scale (a seeded simulation of the curator's
        mechanism, which adds its noise with OpenDP's sampler)."""
        assert self.R is not None, "CTL needs a bounded noise"
        ctl = CTL(epsilon=epsilon, B=self.B, R=self.R)
        out: np.ndarray = np.clip(y, -ctl.bound, ctl.bound) + draws * ctl.scale
        return out


def _noise(rng: np.random.Generator, T: int, student_t: bool) -> tuple[np.ndarray, np.ndarray]:
    eta = rng.standard_t(STUDENT_T_DOF, T) if student_t else rng.uniform(-NOISE_BOUND, NOISE_BOUND, T)
    return eta, rng.laplace(0.0, 1.0, T)


def paper_problem(setting: str, seed: int, run: int, T: int) -> Problem:
    """``se`` / ``matern`` (U[-1, 1] noise, for CTL) or ``student-t`` (SE, Student-t(3), no privatisation).

    The weights and support points depend on (seed, run) only: se, matern and student-t of one run share them.
    """
    kernel = KERNEL_OF_SETTING[setting]
    f = sample_paper_f(np.random.default_rng([seed, run, 1]), kernel)
    student_t = setting == "student-t"
    eta, lap = _noise(np.random.default_rng([seed, run, 2]), T, student_t)
    return Problem(
        setting=setting,
        Z=domain(),
        f=f,
        B=float(np.abs(f).max()),
        R=None if student_t else NOISE_BOUND,
        eta=eta,
        laplace=lap,
        kernel=kernel,
        lengthscale=PAPER_LENGTHSCALE,
        noise_second_moment=3.0 if student_t else NOISE_BOUND**2 / 3.0,
        extra={},
    )


def combined_problem(seed: int, run: int, T: int) -> Problem:
    """Input and output privacy: pobo's synthetic grid (100 x 100, f ~ GP standardised, as in
    ``shared.tools.bench.synthetic``), released by the Gaussian mechanism at eps_in = 1 (delta = 1e-5);
    outcomes f + U[-1, 1], answered through CTL(eps_out) with the declared B = ``COMBINED_B``. The GP model
    uses f's own SE lengthscale in released units (the ``transfer`` mode of
    ``shared.tools.bench.synthetic``)."""
    rng = np.random.default_rng([seed, run, 3])
    X, scale = grid_inputs()
    f = sample_f(rng, _grid_factor())
    Z = gaussian_release(X, epsilon=EPSILON_INPUT, delta=DELTA, rng=np.random.default_rng([seed, run, 4])).Z
    eta, lap = _noise(np.random.default_rng([seed, run, 2]), T, student_t=False)
    return Problem(
        setting="combined",
        Z=Z,
        f=f,
        B=COMBINED_B,
        R=NOISE_BOUND,
        eta=eta,
        laplace=lap,
        kernel="se",
        lengthscale=LENGTHSCALE * scale,
        noise_second_moment=NOISE_BOUND**2 / 3.0,
        extra={"max_abs_f": float(np.abs(f).max()), "epsilon_input": EPSILON_INPUT, "delta_input": DELTA},
    )


def make_problem(setting: str, seed: int, run: int, T: int) -> Problem:
    if setting == "combined":
        return combined_problem(seed, run, T)
    if setting in KERNEL_OF_SETTING:
        return paper_problem(setting, seed, run, T)
    raise ValueError(f"unknown setting {setting!r}")


def moma_paper_k(T: int, delta: float = 0.05) -> int:
    """MoMA-GP-UCB's k = ceil(24 ln(4 e T / delta)) (Algorithm 3, line 3): 295 at T = 1000, delta = 0.05."""
    return math.ceil(24.0 * math.log(4.0 * math.e * T / delta))
