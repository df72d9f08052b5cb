"""Does the curator's grant give a strategy the answers it assumes? Checked once, when a study is created.

Local-DP strategies (``ldp-*``; Zhou & Tan 2021) set truncation levels and beta_t from the Laplace scale
2 (B + R) / epsilon of the curator's CTL mechanism, so their ``epsilon``, ``B`` and ``R`` are the grant's:
taken from it when the study leaves them out, and a 422 when a given value differs.
Repeated-play strategies (MoMA-GP-UCB plays one row k times per epoch) need k *fresh* noisy answers of a row:
under a grant that privatises outcomes that means ``fresh_repeats`` and ``max_epsilon_per_row`` >= k times
the charge of one answer (a cached repeat would hand back the same noisy value k times).
"""

from __future__ import annotations

import math

from shared.bo.strategies import Strategy, StrategyParams
from shared.protocol.schemas import OutputPrivacyPublic

__all__ = ["fit_to_grant", "grant_problem", "needs_grant"]


def needs_grant(strategy: type[Strategy], params: StrategyParams, budget: int) -> bool:
    """Whether the strategy's assumptions depend on the grant (then the modeler reads it first)."""
    return (
        strategy.output_privacy(params) is not None or strategy.fresh_plays_per_row(params, budget=budget) > 1
    )


def grant_problem(
    strategy: type[Strategy], params: StrategyParams, budget: int, grant: OutputPrivacyPublic | None
) -> str | None:
    """Why the grant does not fit the strategy (an actionable sentence), or None when it does."""
    name = strategy.name
    assumed = strategy.output_privacy(params)
    if assumed is not None:
        if grant is None:
            plain = name.removeprefix("ldp-")
            return (
                f"strategy {name!r} is for outcomes privatised by the curator (CTL), but this token's grant "
                "answers outcomes as measured (it has no output_privacy): use the non-private counterpart "
                f"{plain!r}, or ask the curator for a grant with output_privacy"
            )
        declared = (grant.epsilon, grant.B, grant.R)
        differ = [
            f"{name} = {a:g}"
            for name, a, b in zip(("epsilon", "B", "R"), assumed, declared, strict=True)
            if a is not None and not math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
        ]
        if differ:
            return (
                f"strategy_params {', '.join(differ)} differ from the curator's grant (epsilon = "
                f"{grant.epsilon:g}, B = {grant.B:g}, R = {grant.R:g}): leave them out to use the grant's "
                "values, or set them to the grant's (GET /v1/partners/me on the curator shows them)"
            )
    k = strategy.fresh_plays_per_row(params, budget=budget)
    if k > 1 and grant is not None:
        if not grant.fresh_repeats:
            return (
                f"strategy {name!r} plays each chosen row k = {k} times and needs {k} fresh noisy answers of "
                "it, but this grant answers a repeated row from its cache (fresh_repeats is false): ask the "
                f"curator for fresh_repeats with max_epsilon_per_row >= {k} x {grant.charged_epsilon:.6g} = "
                f"{k * grant.charged_epsilon:.6g}, or use a strategy that plays each row once "
                "(e.g. ldp-tgp-ucb)"
            )
        cap = grant.max_epsilon_per_row
        if cap is not None and k * grant.charged_epsilon > cap * (1 + 1e-9):
            fits = math.floor(cap / grant.charged_epsilon * (1 + 1e-9))
            need = k * grant.charged_epsilon
            return (
                f"strategy {name!r} needs k = {k} fresh answers of a row, {k} x {grant.charged_epsilon:.6g} "
                f"= {need:.6g} of output epsilon per person, but the grant caps one person at "
                f"max_epsilon_per_row = {cap:g}: set strategy_params.k to at most {fits}, or ask the curator "
                "to raise max_epsilon_per_row"
            )
    return None


def fit_to_grant(
    strategy: type[Strategy], params: StrategyParams, grant: OutputPrivacyPublic | None
) -> StrategyParams:
    """``params`` completed from the grant, for what the study left out: whether a row may be played again
    (``with_answers``: only when the grant answers a repeat with fresh noise), a local-DP strategy's epsilon,
    B and R (the grant's CTL), and ``max_plays_per_row`` from the grant's per-person cap when the strategy has
    that parameter (a row whose person cannot afford another epoch is never chosen: the curator would
    refuse its plays with 409 and fail the study). The study records the completed parameters."""
    params = strategy.with_answers(params, fresh_repeats=grant is not None and grant.fresh_repeats)
    if grant is not None:
        params = strategy.with_output_privacy(params, epsilon=grant.epsilon, B=grant.B, R=grant.R)
    if (
        grant is None
        or grant.max_epsilon_per_row is None
        or "max_plays_per_row" not in type(params).model_fields
        or getattr(params, "max_plays_per_row", None) is not None
    ):
        return params
    plays = max(1, math.floor(grant.max_epsilon_per_row / grant.charged_epsilon * (1 + 1e-9)))
    return type(params).model_validate(params.model_dump() | {"max_plays_per_row": plays})
