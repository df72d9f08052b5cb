"""DP-GIBO over a curator's private gradient oracle (registry strategy ``dp-gibo``).

Paper: "Scalable DP Bayesian optimisation" (DP-GIBO), Algorithm 1 (fixed batch size b), Algorithm 2 (adaptive
b, lines 4-5), Remark 4.1 (AdaGrad on the released gradient), Section 3.4 (noisy observations: sigma^2 I in
line 6). The modeler runs the part of Algorithm 1 that touches no data; the curator's gradient oracle
(``shared.bo.gibo.oracle``) runs lines 5-8 on the rows and releases only the noisy gradient.

Notation (shapes in brackets)::

    theta^(t) [d];  bounds [d, 2] (the oracle's public box);  D_{t-1} [m, d] every point sent so far
    plan (round t + 1):   Z_t = argmin_{|Z| = b} alpha(Z; D_{t-1}, theta^(t))      (Alg. 1 line 4; Alg. 2 4-5)
                          -> GradientRequest(theta^(t), Z_t, kernel, noise_var, jitter)
    curator:              D_t = D_{t-1} u Z_t;  g_t = (1/n) sum_i Pi_B(grad mu_i) + N(0, sigma^2 I_d)  (5-8)
    observe:              D_t = D_{t-1} u Z_t;  theta^(t+1) = Pi_box(updater(theta^(t), g_t))         (line 8)

The choices are those of ``shared.bo.gibo.loop.run_dp_gibo``, split into ``plan`` and ``observe``: the
acquisition's GP has the jitter but not ``noise_var`` (Section 3.4 adds sigma^2 I in line 6 only); the batch
is optimised with the round's generator (``round_rng``: a re-plan is identical); b is ``batch_size``
(Algorithm 1), or the smallest b <= d + 1 whose optimised alpha reaches ``tolerance`` (Algorithm 2), or by
default d + 1 (the authors' choice: d + 1 points pin down a gradient of an exact GP, Section 3.3).

Defaults relative to the oracle's box (lo, hi), with w = hi - lo [d]: theta0 = the box's centre; the SE
lengthscale l = 0.2 ||w||_2 (a fifth of the box's diagonal: the batch is drawn near theta with spread
``init_scale`` w, well inside one lengthscale, so the local GP sees a smooth surface); AdaGrad's lr = 0.1
mean(w) (its first step moves each coordinate by at most a tenth of the box); gradient descent's lr = 0.1.

The state is a function of the parameters, the domain and the recorded rounds alone (theta, D, the
updater's accumulated squares, the number of steps), so ``from_history`` replays the audit log; each round's
recorded theta and theta_next are checked against the replay.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field, model_validator

from shared.bo.gibo.acquisition import choose_adaptive_batch, optimize_batch
from shared.bo.gibo.gp import GradientGP
from shared.bo.gibo.kernels import GradKernel, PolynomialKernel, SEKernel
from shared.bo.gibo.updates import AdaGrad, GradientDescent, make_updater
from shared.bo.strategies.base import (
    GradientAnswer,
    GradientDomain,
    GradientRequest,
    RequestKind,
    RoundOutcome,
    RunsOn,
    Strategy,
    StrategyParams,
    register,
)
from shared.errors import InputDataError, StrategyError

FloatArray = npt.NDArray[np.float64]

__all__ = [
    "DPGIBOParams",
    "DPGIBOStrategy",
    "PolynomialKernelParams",
    "SEKernelParams",
    "default_lengthscale",
]

#: Most points one step may send (the curator's MAX_POINTS_PER_STEP).
MAX_BATCH = 1001


def default_lengthscale(bounds: npt.ArrayLike) -> float:
    """The SE lengthscale used when none is given: 0.2 ||hi - lo||_2, a fifth of the box's diagonal."""
    bd = np.asarray(bounds, dtype=np.float64)
    return 0.2 * float(np.linalg.norm(bd[:, 1] - bd[:, 0]))


class SEKernelParams(StrategyParams):
    """Squared exponential s2 exp(-|x - y|^2 / (2 l^2)) (DP-GIBO Section 2.4)."""

    kind: Literal["se"] = "se"
    lengthscale: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="l; default 0.2 x the diagonal of the oracle's box, ||hi - lo||_2.",
    )
    signal_variance: float = Field(default=1.0, gt=0, allow_inf_nan=False, description="s2.")


class PolynomialKernelParams(StrategyParams):
    """Polynomial (x.y + c)^p (DP-GIBO Section 4.1 uses p = 2, c = 1)."""

    kind: Literal["polynomial"]
    degree: int = Field(default=2, ge=1, le=10, description="p.")
    offset: float = Field(default=1.0, ge=0, allow_inf_nan=False, description="c.")


class DPGIBOParams(StrategyParams):
    """Parameters of ``dp-gibo`` (DP-GIBO Algorithms 1 and 2, Remark 4.1)."""

    theta0: list[float] | None = Field(
        default=None,
        min_length=1,
        max_length=1000,
        description="theta^(0), inside the oracle's bounds (Alg. 1 line 2); default: the box's centre.",
    )
    kernel: SEKernelParams | PolynomialKernelParams = Field(
        default_factory=SEKernelParams,
        discriminator="kind",
        description='The surrogate\'s kernel: {"kind": "se", "lengthscale", "signal_variance"} (default) '
        'or {"kind": "polynomial", "degree", "offset"}.',
    )
    updater: Literal["adagrad", "gd"] = Field(
        default="adagrad", description="adagrad (Remark 4.1) or gd (plain gradient descent, Alg. 1 line 8)."
    )
    lr: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Learning rate eta; default adagrad: 0.1 x the box's mean width, gd: 0.1.",
    )
    batch_size: int | None = Field(
        default=None,
        ge=1,
        le=MAX_BATCH,
        description="b, new design points per step (Algorithm 1). Default (without tolerance): d + 1.",
    )
    tolerance: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="epsilon of Algorithm 2: each step sends the smallest b <= d + 1 whose optimised "
        "alpha = Tr Sigma is <= tolerance (d + 1 if none). Exclusive with batch_size.",
    )
    init_scale: float = Field(
        default=0.1,
        gt=0,
        le=10,
        allow_inf_nan=False,
        description="Batch optimisation starts at theta + init_scale x box width x N(0, 1).",
    )
    n_restarts: int = Field(default=1, ge=1, le=20, description="Restarts of the batch optimisation.")
    noise_var: float = Field(
        default=0.0, ge=0, le=1e6, allow_inf_nan=False, description="sigma^2 of Section 3.4 (noisy losses)."
    )
    jitter: float = Field(default=1e-8, ge=0, le=1e-2, allow_inf_nan=False, description="Diagonal jitter.")

    @model_validator(mode="after")
    def _one_batch_rule(self) -> DPGIBOParams:
        if self.batch_size is not None and self.tolerance is not None:
            raise ValueError(
                "give batch_size (Algorithm 1) or tolerance (Algorithm 2), not both; neither: b = d + 1"
            )
        return self


@register
class DPGIBOStrategy(Strategy[GradientRequest, GradientAnswer, DPGIBOParams]):
    """``dp-gibo``: one private gradient step per round over the curator's oracle (see the module)."""

    name: ClassVar[str] = "dp-gibo"
    description: ClassVar[str] = (
        "DP-GIBO, differentially private gradient-informative Bayesian optimisation (Scalable DP Bayesian "
        "optimisation, Algorithms 1 and 2): runs on a curator's private gradient oracle (gradient_oracle_id, "
        "not release_id). Each round chooses a batch of design points near theta minimising alpha = the "
        "trace of the GP posterior covariance of the gradient at theta (b = batch_size, Algorithm 1; the "
        "smallest b <= d + 1 reaching tolerance, Algorithm 2; default d + 1), the curator answers the "
        "clipped, averaged, Gaussian-noised posterior-mean gradient, and theta takes an AdaGrad (Remark 4.1) "
        "or gradient-descent step projected onto the oracle's box."
    )
    Params: ClassVar[type[StrategyParams]] = DPGIBOParams
    kinds: ClassVar[tuple[RequestKind, ...]] = ("gradient",)
    runs_on: ClassVar[RunsOn] = "gradient-oracle"

    def __init__(self, Z: Any, params: DPGIBOParams, state: Mapping[str, Any]) -> None:
        if not isinstance(params, DPGIBOParams):  # (a caller's mix-up: the registry parses DPGIBOParams)
            raise InputDataError(f"dp-gibo needs DPGIBOParams, got {type(params).__name__}")
        domain = Z if isinstance(Z, GradientDomain) else GradientDomain.from_public(Z)
        self.check_domain(params, domain, budget=1)
        self.domain = domain
        self.params = params
        self.state = dict(state)
        self.bounds: FloatArray = domain.array()
        d = domain.dimension
        width = self.bounds[:, 1] - self.bounds[:, 0]
        spec = params.kernel
        if isinstance(spec, SEKernelParams):
            ls = spec.lengthscale if spec.lengthscale is not None else default_lengthscale(self.bounds)
            self.kernel_spec: dict[str, Any] = {
                "kind": "se",
                "lengthscale": float(ls),
                "signal_variance": float(spec.signal_variance),
            }
            self.kernel: GradKernel = SEKernel(lengthscale=float(ls), signal_variance=spec.signal_variance)
        else:
            self.kernel_spec = {
                "kind": "polynomial",
                "degree": int(spec.degree),
                "offset": float(spec.offset),
            }
            self.kernel = PolynomialKernel(degree=int(spec.degree), offset=float(spec.offset))
        if params.theta0 is not None:
            self.theta: FloatArray = np.asarray(params.theta0, dtype=np.float64)
        else:
            self.theta = self.bounds.mean(axis=1)
        self.design: FloatArray = np.zeros((0, d))
        if params.updater == "adagrad":
            lr = params.lr if params.lr is not None else 0.1 * float(width.mean())
            self.updater: AdaGrad | GradientDescent = AdaGrad(lr=lr)
        else:
            self.updater = GradientDescent(lr=params.lr if params.lr is not None else 0.1)
        self.t = 0  # steps observed

    # ------------------------------------------------------------------------------------ interface
    @classmethod
    def check_domain(cls, params: DPGIBOParams, domain: GradientDomain, *, budget: int) -> None:
        """theta0 has the oracle's dimension and lies in its box; a batch fits one step."""
        if not isinstance(params, DPGIBOParams):  # (a caller's mix-up: the registry parses DPGIBOParams)
            raise InputDataError(f"dp-gibo needs DPGIBOParams, got {type(params).__name__}")
        d = domain.dimension
        bd = domain.array()
        if params.theta0 is not None:
            theta0 = np.asarray(params.theta0, dtype=np.float64)
            if theta0.shape != (d,):
                raise InputDataError(
                    f"strategy_params.theta0 has {theta0.shape[0]} entries, the gradient oracle's dimension "
                    f"is {d}"
                )
            outside = np.flatnonzero((theta0 < bd[:, 0]) | (theta0 > bd[:, 1]))
            if outside.size:
                k = int(outside[0])
                raise InputDataError(
                    f"strategy_params.theta0[{k}] = {theta0[k]:g} lies outside the oracle's bounds "
                    f"[{bd[k, 0]:g}, {bd[k, 1]:g}]; start inside the box (default: its centre)"
                )
        if params.batch_size is None and d + 1 > MAX_BATCH:
            raise InputDataError(f"the default batch d + 1 = {d + 1} exceeds {MAX_BATCH}: set batch_size")
        largest = params.batch_size if params.batch_size is not None else d + 1
        if domain.max_design is not None and budget * largest > domain.max_design:
            raise InputDataError(
                f"{budget} steps of up to {largest} design points each could reach {budget * largest} "
                f"points; the curator's oracle accepts at most {domain.max_design} over all steps: ask "
                f"for at most {domain.max_design // largest} iterations or set a smaller batch_size"
            )

    def plan(self, *, budget: int, rng: np.random.Generator) -> list[GradientRequest]:
        """One step: the batch Z_t minimising alpha(Z; D_{t-1}, theta^(t)) (Alg. 1 line 4 / Alg. 2 4-5)."""
        if budget < 1:
            raise InputDataError(f"budget must be >= 1, got {budget}")
        p = self.params
        d = self.domain.dimension
        gp = GradientGP(self.kernel, self.design, jitter=p.jitter)  # no noise_var: Section 3.4, line 6 only
        reached: bool | None = None
        if p.tolerance is not None:
            choice = choose_adaptive_batch(
                gp,
                self.theta,
                self.bounds,
                p.tolerance,
                rng,
                init_scale=p.init_scale,
                n_restarts=p.n_restarts,
            )
            Z, alpha, b, reached, algorithm = choice.Z, choice.alpha, choice.b, choice.reached_tolerance, 2
        else:
            b = p.batch_size if p.batch_size is not None else d + 1
            Z, alpha = optimize_batch(
                gp, self.theta, b, self.bounds, rng, init_scale=p.init_scale, n_restarts=p.n_restarts
            )
            algorithm = 1
        theta = tuple(float(v) for v in self.theta)
        details: dict[str, Any] = {
            "source": "dp-gibo",
            "algorithm": algorithm,
            "step": self.t + 1,
            "theta": list(theta),
            "alpha": float(alpha),
            "alpha_before": gp.grad_cov_trace(self.theta),
            "b": int(b),
            "design_size": int(gp.m),
        }
        if reached is not None:
            details["reached_tolerance"] = bool(reached)
        return [
            GradientRequest(
                theta=theta,
                points=tuple(tuple(float(v) for v in z) for z in Z),
                kernel=dict(self.kernel_spec),
                noise_var=float(p.noise_var),
                jitter=float(p.jitter),
                details=details,
            )
        ]

    def outcome(self, answers: Sequence[GradientAnswer]) -> RoundOutcome:
        """theta^(t+1) after the answered step (Alg. 1 line 8), from a copy of the updater."""
        g = self._check(answers)
        theta_next = make_updater(self.updater.to_state()).step(self.theta, g, self.bounds)
        point = tuple(float(v) for v in theta_next)
        return RoundOutcome(details=({"theta_next": list(point)},), point=point)

    def observe(self, answers: Sequence[GradientAnswer]) -> None:
        """D_t = D_{t-1} u Z_t (line 5) and the projected descent step on the released gradient (line 8)."""
        g = self._check(answers)
        request = answers[0].request
        points = np.asarray(request.points, dtype=np.float64).reshape(-1, self.domain.dimension)
        theta_next = self.updater.step(self.theta, g, self.bounds)
        recorded = request.details.get("theta_next")
        if recorded is not None and not _same(recorded, theta_next):
            raise StrategyError(
                f"step {self.t + 1}: the recorded theta_next {recorded} differs from the update "
                f"{theta_next.tolist()}: the study's parameters or the update rule changed since it was "
                "recorded"
            )
        self.design = np.vstack([self.design, points])
        self.theta = theta_next
        self.t += 1

    def point(self) -> tuple[float, ...]:
        """theta^(t), the current estimate (what Algorithm 1 returns after the last step, line 10)."""
        return tuple(float(v) for v in self.theta)

    # -------------------------------------------------------------------------------------- helpers
    def _check(self, answers: Sequence[GradientAnswer]) -> FloatArray:
        """The round's gradient [d], after checking that it answers a step planned at the current theta."""
        if len(answers) != 1 or not isinstance(answers[0], GradientAnswer):
            raise StrategyError(f"dp-gibo observes one gradient answer per round, got {len(answers)} answers")
        answer = answers[0]
        d = self.domain.dimension
        if not _same(answer.request.theta, self.theta):
            raise StrategyError(
                f"step {self.t + 1} was asked at theta {list(answer.request.theta)}, but the strategy is at "
                f"{self.theta.tolist()}: the rounds are out of order or from another study"
            )
        g = np.asarray(answer.gradient, dtype=np.float64)
        if g.shape != (d,) or not np.isfinite(g).all():
            raise StrategyError(f"the curator's gradient must be {d} finite numbers, got shape {g.shape}")
        points = np.asarray(answer.request.points, dtype=np.float64)
        if points.size and (points.ndim != 2 or points.shape[1] != d):
            raise StrategyError(f"the step's points must be [b, {d}], got shape {points.shape}")
        return g


def _same(a: Any, b: Any) -> bool:
    """Equal vectors up to float round-off (a JSON round trip is exact; this only absorbs a few ulp)."""
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return x.shape == y.shape and bool(np.allclose(x, y, rtol=1e-12, atol=1e-12))
