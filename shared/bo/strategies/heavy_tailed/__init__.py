"""GP-UCB strategies for heavy-tailed payoffs and for local-DP answers (six registry names).

One class per algorithm, each with a non-private (heavy-tailed moment bound v, alpha; Chowdhury & Gopalan,
NeurIPS 2019) and a local-DP (epsilon, B, R of the curator's Laplace mechanism; Zhou & Tan, AAAI 2021)
parameterisation:

- ``tgp-ucb`` / ``ldp-tgp-ucb`` (``tgp``): GP-UCB on zero-truncated rewards (Zhou & Tan, Alg. 2);
- ``ata-gp-ucb`` / ``ldp-ata-gp-ucb`` (``ata``): Nystrom features + feature-adaptive truncation (Alg. 1);
- ``moma-gp-ucb`` / ``ldp-moma-gp-ucb`` (``moma``): epochs of k plays, median of means (Alg. 3).

Shared parameters and constants are in ``common``; the Nystrom embedding (Alg. 4) in ``shared.bo.nystrom``.
"""

from shared.bo.strategies.heavy_tailed.ata import (
    ATAGPUCBStrategy,
    ATAParams,
    LDPATAGPUCBStrategy,
    LDPATAParams,
    ata_beta,
    ata_truncation,
)
from shared.bo.strategies.heavy_tailed.common import HeavyTailedParams, LDPParams, NystromParams, Tails
from shared.bo.strategies.heavy_tailed.moma import (
    K_DEFAULT,
    LDPMoMAGPUCBStrategy,
    LDPMoMAParams,
    MoMAGPUCBStrategy,
    MoMAParams,
    default_k,
    median_of_means,
    moma_beta,
)
from shared.bo.strategies.heavy_tailed.tgp import (
    LDPTGPParams,
    LDPTGPUCBStrategy,
    TGPParams,
    TGPUCBStrategy,
    tgp_beta,
    tgp_truncation,
)

__all__ = [
    "ATAGPUCBStrategy",
    "ATAParams",
    "HeavyTailedParams",
    "LDPATAGPUCBStrategy",
    "LDPATAParams",
    "LDPMoMAGPUCBStrategy",
    "LDPMoMAParams",
    "LDPParams",
    "LDPTGPParams",
    "LDPTGPUCBStrategy",
    "MoMAGPUCBStrategy",
    "MoMAParams",
    "NystromParams",
    "TGPParams",
    "TGPUCBStrategy",
    "Tails",
    "ata_beta",
    "ata_truncation",
    "K_DEFAULT",
    "default_k",
    "median_of_means",
    "moma_beta",
    "tgp_beta",
    "tgp_truncation",
]
