"""Request and response bodies of the federation API (``API.md``, "Federations (DP-FTS-DE, modeler
service)"; the named fields are fixed there).

Part of the wire contract: the modeler service (the coordinator) answers with these, and the federation
client (``shared.protocol.client.FederationClient``, which the hospitals' agents use) parses them. Pure
pydantic, like the whole package.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from shared.errors import InputDataError
from shared.protocol.schemas.common import Request

FederationStatus = Literal["registering", "running", "done"]
RoundStatus = Literal["open", "closed"]

#: Largest M and P x M the coordinator accepts (the aggregates of a round are P x M floats in JSON).
MAX_M = 5000
MAX_AGGREGATE_VALUES = 200_000
#: How far ahead of the modeler's clock ``first_round_at`` may be (``POST .../start``).
MAX_FIRST_ROUND_DELAY = timedelta(hours=24)
#: The header an agent process names itself with on every request (a random id per process, its
#: "instance"): the coordinator tells a restarted agent (a new instance replaces the old one) from two
#: processes running on one agent token (their requests alternate), and warns the second case.
AGENT_INSTANCE_HEADER = "Pobo-Agent-Instance"
#: What an instance id may be (``uuid4().hex`` in ``pobo agent run``).
AGENT_INSTANCE_PATTERN = r"^[A-Za-z0-9_-]{8,64}$"
_WARNING = (
    "Set when the coordinator sees two processes of this agent using one agent token at once (their "
    f"{AGENT_INSTANCE_HEADER} headers alternate): say which, and what to do. Null otherwise; a restarted "
    "agent replacing its old process is not warned."
)


class TemperatureIn(Request):
    """T_t of the softmax weights (``shared.federated.TemperatureSchedule``): 1 for rounds t < hold, then
    1 + growth (t - hold); uniform weights (T = inf) from round ``uniform_from`` on, if set."""

    hold: int = Field(default=0, ge=0, le=1_000_000)
    growth: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    uniform_from: int | None = Field(default=None, ge=0, le=1_000_000)


class FederationCreate(Request):
    """The public parameters of a DP-FTS-DE federation, fixed at creation (issue 16)."""

    dimension: int = Field(ge=1, le=100, description="Input dimension d.")
    bounds: list[list[float]] = Field(
        description="The box: one [lower, upper] pair per dimension, lower < upper.", min_length=1
    )
    P: int = Field(ge=1, le=4096, description="Sub-regions (a product of 2, 3, 5, 7).")
    M: int = Field(ge=1, le=MAX_M, description="Random Fourier features shared by every agent.")
    q: float = Field(gt=0, le=1, description="Poisson sampling probability of an agent per round.")
    z: float = Field(gt=0, allow_inf_nan=False, description="Noise multiplier.")
    S: float = Field(
        gt=0, allow_inf_nan=False, description="Clipping bound (each omega clipped to S/sqrt(P))."
    )
    rounds: int = Field(ge=1, le=10_000, description="Rounds to run (fewer if the budget stops it).")
    epsilon_budget: float = Field(gt=0, allow_inf_nan=False, description="Largest epsilon (PLD, at delta).")
    delta: float = Field(default=1e-5, gt=0, lt=1, description="delta of the reported epsilons.")
    round_seconds: float = Field(
        ge=0.1, le=86_400, description="A round closes when this many seconds have passed since it opened."
    )
    temperature: TemperatureIn = Field(default_factory=TemperatureIn)
    lengthscale: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="Lengthscale of the SE kernel whose features are drawn. Unset: 0.2 x the mean box width.",
    )
    signal_variance: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    n_init: int = Field(default=2, ge=1, le=1000, description="Agents' initial points in their sub-region.")
    p_schedule: Literal["inv_sqrt", "inv"] = Field(
        default="inv_sqrt", description="Agents' probability of local TS: 1 - 1/sqrt(t) or 1 - 1/t."
    )

    @model_validator(mode="after")
    def _check(self) -> FederationCreate:
        if len(self.bounds) != self.dimension:
            raise ValueError(
                f"bounds must have one [lower, upper] pair per dimension: "
                f"{self.dimension} != {len(self.bounds)}"
            )
        for j, pair in enumerate(self.bounds):
            if len(pair) != 2 or not all(math.isfinite(v) for v in pair) or not pair[0] < pair[1]:
                raise ValueError(f"bounds[{j}] must be [lower, upper] with finite lower < upper, got {pair}")
        from shared.federated.regions import split_box  # (importing the contract loads no numerics)

        try:
            split_box([p[0] for p in self.bounds], [p[1] for p in self.bounds], self.P)
        except InputDataError as exc:
            raise ValueError(str(exc)) from None
        if self.P * self.M > MAX_AGGREGATE_VALUES:
            raise ValueError(f"P x M must be at most {MAX_AGGREGATE_VALUES}, got {self.P * self.M}")
        u = self.temperature.uniform_from
        if u is not None and u < self.temperature.hold:
            raise ValueError(
                f"temperature.uniform_from ({u}) must be >= temperature.hold ({self.temperature.hold})"
            )
        return self


class AgentCreate(Request):
    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:@ -]+$")


class AgentCreated(BaseModel):
    """A new agent and its token (shown once; only its sha256 is stored)."""

    id: str
    federation_id: str
    name: str
    token: str


class AgentPublic(BaseModel):
    """A registered agent; ``position`` (n in the frozen list) and ``region`` (i_n) once started."""

    id: str
    name: str
    position: int | None
    region: int | None


class FederationStart(Request):
    """The optional body of ``POST .../start``."""

    first_round_at: datetime | None = Field(
        default=None,
        strict=False,  # an ISO 8601 string in JSON
        description=(
            "When the agents will be up (ISO 8601 with a timezone, e.g. 2026-05-01T12:00:00Z, in the future "
            "and at most 24 hours ahead of the modeler's clock). Round 1 opens for submissions at once; its "
            "deadline is first_round_at + round_seconds instead of start + round_seconds, so that agents "
            "started together with the federation (Python start-up, a slow network) take part in round 1. "
            "Absent: round 1's deadline is round_seconds after the start."
        ),
    )

    @field_validator("first_round_at")
    @classmethod
    def _aware(cls, value: datetime | None) -> datetime | None:
        if value is not None and (value.tzinfo is None or value.utcoffset() is None):
            raise ValueError(
                "first_round_at has no timezone: send an ISO 8601 time with one, e.g. "
                "2026-05-01T12:00:00Z or 2026-05-01T14:00:00+02:00"
            )
        return value


class FederationPublic(BaseModel):
    id: str
    created_at: datetime
    status: FederationStatus
    stop_reason: Literal["rounds", "budget"] | None = Field(
        description="Why a done federation stopped: every round run, or the next round would pass the budget."
    )
    round: int = Field(description="The current (open) round; 0 before start; the last round once done.")
    round_deadline: datetime | None = Field(description="Deadline of the open round (null if none is open).")
    rounds_closed: int
    participants: int | None = Field(description="N, the size of the agent list frozen at start.")
    epsilon_pld: float = Field(
        description="epsilon after the rounds closed so far (PLD accountant, at delta)."
    )
    epsilon_rdp: float = Field(description="The same, by the RDP accountant (an upper bound).")
    epsilon_replace_one_pld: float = Field(
        description="Replace-one epsilon (one agent's submissions replaced by others), PLD, at delta."
    )
    params: dict[str, Any] = Field(description="The parameters declared at creation.")
    rff: dict[str, Any] = Field(description="The published random Fourier features (frequencies, phases).")
    region_counts: list[int] = Field(description="Cells per axis of the P equal-volume sub-regions.")
    agents: list[AgentPublic] | None = Field(description="The registered agents (modeler token only).")
    you: AgentPublic | None = Field(description="The calling agent (agent token only).")
    warning: str | None = Field(default=None, description=_WARNING)


class FederationsPublic(BaseModel):
    data: list[FederationPublic]
    count: int


class SubmissionCreate(Request):
    omega: list[float] = Field(min_length=1, max_length=MAX_M, description="omega_{n,t}, M numbers.")


class SubmissionAccepted(BaseModel):
    """The receipt of an accepted submission (also the answer to a replay of its Idempotency-Key, before or
    after the round closed)."""

    federation_id: str
    round: int = Field(description="The round the submission was accepted in.")
    status: Literal["accepted"] = "accepted"
    accepted: Literal[True] = Field(
        default=True,
        description=(
            "Always true: the submission is in the round (it enters the round's aggregate if the round's "
            "Poisson sample draws the agent; the sample is never revealed, not even to the agent)."
        ),
    )
    accepted_at: datetime = Field(
        description="When the coordinator accepted it (before the round's deadline)."
    )
    round_status: RoundStatus = Field(
        description="open: the round has not closed yet; closed: it closed with this submission in it."
    )
    warning: str | None = Field(default=None, description=_WARNING)


class RoundStanding(BaseModel):
    """The calling agent's own standing in one round, from its receipt (nothing about any other agent)."""

    accepted: bool = Field(
        description=(
            "Whether a submission of this agent was accepted in this round. Once the round is closed this is "
            "final: true means it was in the round's aggregate (subject to the secret Poisson sample), false "
            "that the round closed without it."
        )
    )
    accepted_at: datetime | None = Field(description="When it was accepted; null if it was not.")


class RoundPublic(BaseModel):
    round: int
    status: RoundStatus
    deadline: datetime = Field(description="The round closes at this time (never earlier).")
    participants: int = Field(description="N, the frozen agent list (not who submitted).")
    aggregates: list[list[float]] | None = Field(description="omega_t^joint, P x M; null while open.")
    epsilon_pld: float | None = Field(description="epsilon after this round (PLD); null while open.")
    epsilon_rdp: float | None = Field(description="epsilon after this round (RDP); null while open.")
    you: RoundStanding | None = Field(
        description=(
            "The calling agent's standing in this round (agent token only; null for the modeler, and for a "
            "round closed before the modeler kept receipts)."
        ),
    )
    warning: str | None = Field(default=None, description=_WARNING)
