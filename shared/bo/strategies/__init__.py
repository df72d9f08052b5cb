"""The modeler's optimisation strategies, by name (``REGISTRY``), behind one round interface (``base``).

Importing this package registers every built-in strategy: ``gp-ucb`` (``gp_ucb``), ``gp-bucb`` (``gp_bucb``),
``random`` (``random_rows``), and the heavy-tailed / local-DP GP-UCB family (``heavy_tailed``): ``tgp-ucb``,
``ata-gp-ucb``, ``moma-gp-ucb`` and their local-DP versions ``ldp-tgp-ucb``, ``ldp-ata-gp-ucb``,
``ldp-moma-gp-ucb`` (Zhou & Tan, AAAI 2021; Chowdhury & Gopalan, NeurIPS 2019); and ``dp-gibo``
(``dp_gibo``), which runs on a curator's private gradient oracle instead of a release (DP-GIBO, Algorithms 1
and 2).
"""

from shared.bo.strategies.base import (
    REGISTRY,
    Answer,
    GradientAnswer,
    GradientDomain,
    GradientRequest,
    RequestKind,
    RoundOutcome,
    RowRequest,
    RunsOn,
    Strategy,
    StrategyParams,
    catalogue,
    get_strategy,
    gradient_answer_from_record,
    gradient_record,
    parse_params,
    register,
    round_rng,
)
from shared.bo.strategies.dp_gibo import DPGIBOParams, DPGIBOStrategy, default_lengthscale
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
from shared.bo.strategies.heavy_tailed import (
    ATAGPUCBStrategy,
    LDPATAGPUCBStrategy,
    LDPMoMAGPUCBStrategy,
    LDPTGPUCBStrategy,
    MoMAGPUCBStrategy,
    TGPUCBStrategy,
)
from shared.bo.strategies.random_rows import RandomParams, RandomRowsStrategy

__all__ = [
    "GPUCB",
    "REGISTRY",
    "ATAGPUCBStrategy",
    "Answer",
    "DPGIBOParams",
    "DPGIBOStrategy",
    "FixedHyperparameters",
    "GPBUCBParams",
    "GPBUCBStrategy",
    "GPUCBParams",
    "GPUCBStrategy",
    "GradientAnswer",
    "GradientDomain",
    "GradientRequest",
    "HallucinatedVariance",
    "LDPATAGPUCBStrategy",
    "LDPMoMAGPUCBStrategy",
    "LDPTGPUCBStrategy",
    "MoMAGPUCBStrategy",
    "RandomParams",
    "RandomRowsStrategy",
    "RequestKind",
    "RoundOutcome",
    "RowRequest",
    "RunsOn",
    "Strategy",
    "StrategyParams",
    "Suggestion",
    "TGPUCBStrategy",
    "catalogue",
    "default_lengthscale",
    "default_refit_schedule",
    "get_strategy",
    "gp_bucb_beta",
    "gp_ucb_beta",
    "gradient_answer_from_record",
    "gradient_record",
    "parse_params",
    "random_initial_indices",
    "register",
    "round_rng",
]
