"""The accounting of a federation's rounds (DP-FTS-DE, ``shared.federated.privacy``): epsilon after t rounds
under PLD and RDP (zero-out relation) and PLD under replace-one, cached, since dp-accounting takes seconds
cold; ``warm_accounting`` fills the caches before a round closes, so that the close itself is quick."""

from __future__ import annotations

import functools
from typing import Any

from shared.federated.privacy import federated_epsilon, federated_epsilon_replace_one


@functools.lru_cache(maxsize=4096)
def epsilon_pld(q: float, z: float, rounds: int, delta: float, entries: int) -> float:
    """epsilon (zero-out relation, PLD) after ``rounds`` rounds of ``entries`` = P M noisy entries, the
    Gaussian sampler's margins included; cached (seconds of dp-accounting cold)."""
    return federated_epsilon(q, z, rounds, delta, accountant="pld", entries=entries)


@functools.lru_cache(maxsize=4096)
def epsilon_rdp(q: float, z: float, rounds: int, delta: float, entries: int) -> float:
    return federated_epsilon(q, z, rounds, delta, accountant="rdp", entries=entries)


@functools.lru_cache(maxsize=4096)
def epsilon_replace_one(q: float, z: float, rounds: int, delta: float, entries: int) -> float:
    return federated_epsilon_replace_one(q, z, rounds, delta, accountant="pld", entries=entries)


def accounting_params(params: dict[str, Any]) -> tuple[float, float, float, int]:
    """(q, z, delta, P M): what the accounting of a federation's rounds depends on."""
    return float(params["q"]), float(params["z"]), float(params["delta"]), int(params["P"]) * int(params["M"])


def warm_accounting(params: dict[str, Any], number: int) -> None:
    """Compute (into the caches) what closing round ``number`` will need, so the close itself is quick."""
    q, z, delta, entries = accounting_params(params)
    epsilon_pld(q, z, number, delta, entries)
    epsilon_rdp(q, z, number, delta, entries)
    epsilon_replace_one(q, z, number, delta, entries)
    if number < int(params["rounds"]):
        epsilon_pld(q, z, number + 1, delta, entries)
