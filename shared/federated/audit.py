"""Empirical privacy audit of one DP-FTS-DE round, as the coordinator closes it in production.

Paper: DP-FTS-DE (Dai, Low & Jaillet, NeurIPS 2021), Algorithm 1 and Section 3.3: a round Poisson-samples
the frozen agent list with probability q, clips each sampled submission, adds the weighted sum to every
sub-region's aggregate, adds Gaussian noise of std z varphi_max S / q (exactly: ``shared.privacy.lattice``).
Under the zero-out relation (an agent's submission replaced by nothing) one round is the Poisson-subsampled
Gaussian mechanism with noise multiplier z, what ``shared.federated.privacy`` composes; at q = 1 it is the
Gaussian mechanism, (1 / z)-GDP.

The mechanism the audit runs is production's pair ``poisson_sample`` + ``aggregate_round`` (the noise and the
sample drawn from the audit's seeded AES-CTR generator, the production generator class), on one round with
P = 1 (so every agent's weight is 1 / N = varphi_max and the pair is the worst case of the sensitivity
varphi_max S / q). The target agent submits 2 S (1, ..., 1) / sqrt(M) (clipped to norm S) in D and nothing
in D'.

* q = 1: the other three agents submit fixed vectors, so every entry of the clean aggregate is 0.1 without
  the target and 0.188 with it (two binades: where a float sum would leave a trace). Claim: (1/z)-GDP.
* q = 0.5: the target is the only agent that submits; the clean aggregate is 0 without it and
  S / (sqrt(M) N q) in every entry with it (when it is sampled). Claim: the Poisson-subsampled Gaussian with q
  and mu = 1 / z.

Each with the tests and controls of ``shared.privacy.audit.builders``: the likelihood-ratio test (the
projection onto the direction between the two clean aggregates; monotone in the likelihood ratio of the
subsampled mixture too), the precision test, ``sensitivity x1.5`` and ``float addition`` (the round as it
was before its noise was made exact: a perfect test on 16 % of rounds at q = 1).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from shared.federated.coordinator import (
    aggregate_round,
    clean_aggregate,
    poisson_sample,
    round_mechanism,
    softmax_weights,
)
from shared.federated.privacy import federated_epsilon
from shared.federated.regions import round_robin
from shared.privacy.audit import Claim, Mechanism, Registry, exact_gaussian_audits, projection_statistic

__all__ = ["FEDERATION_AUDITS", "federation_round_audits"]

FloatArray = npt.NDArray[np.float64]


def federation_round_audits(
    *, q: float, z: float = 1.0, N: int = 4, M: int = 8, S: float = 1.0, delta: float = 1e-5
) -> list[Mechanism]:
    """One round of Algorithm 1 on the zero-out pair described above, with its controls."""
    P = 1
    assignment = round_robin(N, P)
    ones = np.ones(M) / np.sqrt(M)
    others = {n: 0.4 * S / (N - 1) * np.ones(M) for n in range(1, N)} if q == 1.0 else {}
    target = 2.0 * S * ones
    submissions: Mapping[bool, dict[int, FloatArray]] = {False: {0: target, **others}, True: dict(others)}

    def aggregate(neighbour: bool, sampled: npt.NDArray[np.bool_]) -> FloatArray:
        subs = submissions[neighbour]
        return clean_aggregate(N, subs, sampled, M=M, P=P, S=S, q=q, temperature=1.0, assignment=assignment)[
            0
        ]

    def run(neighbour: bool, rng: np.random.Generator) -> FloatArray:  # production: sample, aggregate, noise
        sampled = poisson_sample(N, q, rng=rng)
        return aggregate_round(
            N, submissions[neighbour], sampled, M=M, P=P, S=S, q=q, z=z, temperature=1.0, rng=rng,
            assignment=assignment,
        )  # fmt: skip

    def clean(neighbour: bool, rng: np.random.Generator) -> FloatArray:
        return aggregate(neighbour, poisson_sample(N, q, rng=rng))

    everyone = np.ones(N, dtype=np.bool_)
    with_target, without = aggregate(False, everyone), aggregate(True, everyone)
    varphi = softmax_weights(assignment, P, 1.0)
    lattice = round_mechanism(varphi, S=S, q=q, z=z, M=M)
    epsilon = federated_epsilon(q, z, 1, delta)
    claim = (
        Claim("gdp", 1.0 / z, epsilon, delta)
        if q == 1.0
        else Claim("subsampled-gaussian", 1.0 / z, epsilon, delta, q=q)
    )
    return exact_gaussian_audits(
        f"dp-fts-de round (q={q:g})",
        claim,
        run=run,
        clean=clean,
        references=(with_target, without),
        lattice=lattice,
        value_bound=S / q,
        statistic=projection_statistic(with_target, without - with_target),
        describe=(
            "likelihood ratio on the zero-out pair: threshold on the projection of the aggregate onto the "
            "direction from the clean aggregate with the agent to the one without"
        ),
    )


#: The federation's mechanisms for ``pobo audit privacy`` (merged with ``shared.privacy.audit.AUDITS``).
FEDERATION_AUDITS: Registry = {
    "dp-fts-de round (q=1)": lambda: federation_round_audits(q=1.0),
    "dp-fts-de round (q=0.5)": lambda: federation_round_audits(q=0.5),
}
