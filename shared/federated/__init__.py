"""DP-FTS-DE: differentially private federated Thompson sampling with distributed exploration, pure numerics.

Paper: Dai, Low & Jaillet, "Differentially Private Federated Bayesian Optimization with Distributed
Exploration" (NeurIPS 2021), Algorithms 1 (coordinator) and 2 (agent), eq. (2), Proposition 1; issue 16 for
the corrections that keep the guarantee (frozen agent list, zero-out relation, no renormalisation).
Modules: ``rff`` (shared random Fourier features of the SE kernel), ``posterior`` (eq. 2, beta_t),
``regions`` (P equal-volume cells, round robin), ``agent_step`` (Algorithm 2), ``coordinator``
(Algorithm 1), ``privacy`` (dp-accounting, the exact one-round privacy loss of both weighting rules;
``shared.accounting.federated_epsilon`` re-exports the accountant). The HTTP agent that talks to the
coordinator is a tool (``shared.tools.agent``); nothing here imports web, database or HTTP libraries.
"""

from shared.federated.agent_step import (
    AgentChoice,
    agent_submission,
    choose_query,
    initial_points,
    maximize_rff,
    p_t,
)
from shared.federated.coordinator import (
    TemperatureSchedule,
    aggregate_round,
    clean_aggregate,
    clip_rows,
    noise_std,
    poisson_sample,
    round_mechanism,
    softmax_weights,
)
from shared.federated.posterior import RFFPosterior, beta_t, information_gain
from shared.federated.privacy import (
    compare_rules,
    federated_epsilon,
    federated_epsilon_replace_one,
    frozen_round_delta,
    renormalised_round_delta,
)
from shared.federated.regions import Regions, round_robin, split_box
from shared.federated.rff import RandomFourierFeatures, draw_rff, se_kernel

__all__ = [
    "AgentChoice",
    "RFFPosterior",
    "RandomFourierFeatures",
    "Regions",
    "TemperatureSchedule",
    "agent_submission",
    "aggregate_round",
    "beta_t",
    "clean_aggregate",
    "choose_query",
    "clip_rows",
    "compare_rules",
    "draw_rff",
    "federated_epsilon",
    "federated_epsilon_replace_one",
    "frozen_round_delta",
    "information_gain",
    "initial_points",
    "maximize_rff",
    "noise_std",
    "p_t",
    "poisson_sample",
    "renormalised_round_delta",
    "round_mechanism",
    "round_robin",
    "se_kernel",
    "softmax_weights",
    "split_box",
]
