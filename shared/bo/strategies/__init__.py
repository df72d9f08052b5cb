"""The modeler's optimisation strategies, by name (``REGISTRY``), behind one round interface (``base``).

Importing this package registers every built-in strategy: ``gp-ucb`` (``gp_ucb``), ``gp-bucb`` (``gp_bucb``)
and ``random`` (``random_rows``).
"""

from shared.bo.strategies.base import (
    REGISTRY,
    Answer,
    RequestKind,
    RowRequest,
    Strategy,
    StrategyParams,
    catalogue,
    get_strategy,
    parse_params,
    register,
    round_rng,
)
from shared.bo.strategies.gp_bucb import GPBUCBParams, GPBUCBStrategy, HallucinatedVariance, gp_bucb_beta
from shared.bo.strategies.gp_ucb import (
    GPUCB,
    FixedHyperparameters,
    GPUCBParams,
    GPUCBStrategy,
    Suggestion,
    default_refit_schedule,
    gp_ucb_beta,
    random_initial_indices,
)
from shared.bo.strategies.random_rows import RandomParams, RandomRowsStrategy

__all__ = [
    "GPUCB",
    "REGISTRY",
    "Answer",
    "FixedHyperparameters",
    "GPBUCBParams",
    "GPBUCBStrategy",
    "GPUCBParams",
    "GPUCBStrategy",
    "HallucinatedVariance",
    "RandomParams",
    "RandomRowsStrategy",
    "RequestKind",
    "RowRequest",
    "Strategy",
    "StrategyParams",
    "Suggestion",
    "catalogue",
    "default_refit_schedule",
    "get_strategy",
    "gp_bucb_beta",
    "gp_ucb_beta",
    "parse_params",
    "random_initial_indices",
    "register",
    "round_rng",
]
