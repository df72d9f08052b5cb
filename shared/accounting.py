"""Accounting entry points fixed by issue 16: ``shared.accounting.federated_epsilon``.

A thin re-export; the implementation (dp-accounting, zero-out relation, Poisson-subsampled Gaussian composed
over the rounds of DP-FTS-DE's Algorithm 1) lives in ``shared.federated.privacy``.
"""

from __future__ import annotations

from shared.federated.privacy import federated_epsilon, federated_epsilon_replace_one

__all__ = ["federated_epsilon", "federated_epsilon_replace_one"]
