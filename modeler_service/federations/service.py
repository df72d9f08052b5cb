"""Federations: the modeler as the coordinator of DP-FTS-DE (issue 16; ``API.md``, "Federations").

The use cases behind ``api/routes/federations.py`` (no HTTP types here) and the closing of a round, which the
background closer (``closer.py``) and a late long-poll both call. The numerics are
``shared.federated`` (Algorithm 1 in ``coordinator.aggregate_round``, the accountant in ``privacy``); this
module keeps what makes them sound in a service:

* ``start`` freezes the agent list (N, the positions n and the round-robin regions i_n) and opens round 1;
  an agent registered later is refused (409). Weights and noise depend on that list only. With
  ``first_round_at`` round 1 still opens at once, but its deadline is first_round_at + round_seconds: the
  agents started together with the federation are up before it closes.
* A round closes at its deadline only, never early (an early close when everyone has submitted would
  reveal by its timing who did). Closing is ONE transaction: a conditional UPDATE open -> closed (so a
  round is aggregated once, whatever the number of closers or restarts), the Poisson sample (OS entropy),
  the aggregate with OpenDP noise over the frozen list (absent or unsampled agents contribute 0; nothing is
  renormalised), epsilon after the round, the next round opened (or the federation done), and the round's
  raw submissions deleted.
* An accepted submission leaves a receipt (round, agent, Idempotency-Key, accepted time, a salted HMAC of
  the body; never the omega), written with it and kept after the close: a replay of its key answers
  "accepted in round t" even once the round has closed (202, ``Idempotent-Replayed: true``), the same key
  with another omega is a 409, and each agent reads its own standing in a round (``you``), so that it
  reports exactly the rounds that counted. A submission to a closed round without a receipt is a 409.
* Before opening any round, a round that would take epsilon (PLD, at delta) past the budget is refused:
  ``start`` answers 409, a close ends the federation (``stop_reason: "budget"``).

Trust: the coordinator sees each agent's raw omega (a posterior sample of that hospital's observations).
It never logs or returns one and deletes them when their round closes. Nothing published says who
submitted, who was sampled, or how much was clipped.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import secrets
import uuid
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from modeler_service.db import Database, transaction
from modeler_service.exceptions import Conflict, Forbidden, NotFound, Unprocessable
from modeler_service.federations import repository as repo
from modeler_service.federations.access import AGENT_TOKEN_PREFIX, MODELER, Principal, require_modeler
from modeler_service.federations.accounting import (
    accounting_params,
    epsilon_pld,
    epsilon_rdp,
    epsilon_replace_one,
)
from modeler_service.models import (
    Federation,
    FederationAgent,
    FederationReceipt,
    FederationRound,
    FederationSubmission,
    utcnow,
)
from shared.federated.coordinator import TemperatureSchedule, aggregate_round, poisson_sample
from shared.federated.privacy import federation_sampler_margins
from shared.federated.regions import round_robin, split_box
from shared.federated.rff import draw_rff
from shared.privacy.rng import os_entropy_rng
from shared.protocol.schemas.federations import (
    MAX_FIRST_ROUND_DELAY,
    AgentCreate,
    AgentCreated,
    AgentPublic,
    FederationCreate,
    FederationPublic,
    FederationsPublic,
    RoundPublic,
    RoundStanding,
    SubmissionAccepted,
)
from shared.servicekit.tokens import hash_token

log = logging.getLogger("pobo.modeler.federations")

# ------------------------------------------------------------------------------------------- use cases


def _federation_for(
    session: Session, principal: Principal, federation_id: str, *, lock: bool = False
) -> Federation:
    """The federation if the principal may see it (an agent: only its own; another is a 404, like one that
    does not exist, so that an agent learns nothing about other federations)."""
    if principal.kind == "agent" and principal.federation_id != federation_id:
        raise NotFound(f"no federation {federation_id}")
    federation = repo.get_federation(session, federation_id, for_update=lock)
    if federation is None:
        raise NotFound(f"no federation {federation_id}")
    return federation


def create_federation(session: Session, body: FederationCreate) -> Federation:
    """Check that the Gaussian sampler can back the rounds asked for, draw the shared features (OS entropy)
    and store the public parameters."""
    federation_sampler_margins(body.z, body.rounds, body.delta, body.P * body.M)  # InputDataError: a 422
    lower = [float(b[0]) for b in body.bounds]
    upper = [float(b[1]) for b in body.bounds]
    lengthscale = body.lengthscale
    if lengthscale is None:
        lengthscale = 0.2 * float(np.mean(np.asarray(upper) - np.asarray(lower)))
    rff = draw_rff(body.dimension, body.M, lengthscale, body.signal_variance, rng=os_entropy_rng())
    params = body.model_dump(mode="json")
    params["lengthscale"] = lengthscale
    federation = Federation(
        id=uuid.uuid4().hex,
        params=params,
        rff=rff.to_public(),
        status="registering",
        current_round=0,
        rounds_closed=0,
        epsilon_pld=0.0,
        epsilon_rdp=0.0,
        epsilon_replace_one_pld=0.0,
    )
    repo.add(session, federation)
    return federation


def list_federations(session: Session) -> FederationsPublic:
    data = [to_public(session, f, MODELER) for f in repo.list_federations(session)]
    return FederationsPublic(data=data, count=len(data))


def register_agent(
    session: Session, principal: Principal, federation_id: str, body: AgentCreate
) -> AgentCreated:
    require_modeler(principal)
    federation = _federation_for(session, principal, federation_id, lock=True)
    if federation.status != "registering":
        raise Conflict(
            f"federation {federation_id} has started: its agent list is frozen (register agents before "
            "POST .../start)"
        )
    if repo.agent_named(session, federation_id, body.name) is not None:
        raise Conflict(f"federation {federation_id} already has an agent named {body.name!r}")
    token = AGENT_TOKEN_PREFIX + secrets.token_urlsafe(32)
    agent = FederationAgent(
        id=uuid.uuid4().hex,
        federation_id=federation_id,
        seq=repo.next_agent_seq(session, federation_id),
        name=body.name,
        token_hash=hash_token(token),
    )
    repo.add(session, agent)
    repo.touch(federation)
    return AgentCreated(id=agent.id, federation_id=federation_id, name=agent.name, token=token)


def check_first_round_at(first_round_at: datetime, now: datetime) -> None:
    """``first_round_at`` must be in the future and at most ``MAX_FIRST_ROUND_DELAY`` ahead (422 else)."""
    at, clock = first_round_at.isoformat(), now.isoformat(timespec="seconds")
    if first_round_at < now:
        raise Unprocessable(
            f"first_round_at {at} is in the past (the modeler's clock reads {clock}): send the future time "
            "by which your agents will be up, or no body to give round 1 round_seconds from now"
        )
    if first_round_at - now > MAX_FIRST_ROUND_DELAY:
        hours = MAX_FIRST_ROUND_DELAY.total_seconds() / 3600
        raise Unprocessable(
            f"first_round_at {at} is more than {hours:g} hours ahead of the modeler's clock ({clock}): "
            "send a nearer time, or start the federation later"
        )


def start(
    session: Session, principal: Principal, federation_id: str, first_round_at: datetime | None = None
) -> Federation:
    """Freeze the agent list and the round-robin regions, open round 1 (if the budget allows it); round 1's
    deadline is ``first_round_at`` + round_seconds if given (it accepts submissions from now on)."""
    require_modeler(principal)
    now = utcnow()
    if first_round_at is not None:
        check_first_round_at(first_round_at, now)
    federation = _federation_for(session, principal, federation_id, lock=True)
    if federation.status != "registering":
        raise Conflict(f"federation {federation_id} has already started (status {federation.status})")
    agents = repo.agents(session, federation_id)
    if not agents:
        raise Conflict(f"federation {federation_id} has no agents: register at least one before start")
    params = federation.params
    q, z, delta, entries = accounting_params(params)
    first = epsilon_pld(q, z, 1, delta, entries)
    budget = float(params["epsilon_budget"])
    if first > budget:
        raise Conflict(
            f"one round would spend epsilon {first:.4g} (PLD, delta {delta:g}) > the budget {budget:g}: "
            "raise z, lower q, or create a federation with a larger epsilon_budget"
        )
    regions = round_robin(len(agents), int(params["P"]))
    for n, agent in enumerate(agents):
        agent.position, agent.region = n, int(regions[n])
    federation.status = "running"
    federation.participants = len(agents)
    federation.current_round = 1
    repo.touch(federation)
    repo.add(session, _new_round(federation, 1, now, clock_from=first_round_at))
    log.info("federation %s started with %d agents", federation_id, len(agents))
    return federation


def _new_round(
    federation: Federation, number: int, now: datetime, *, clock_from: datetime | None = None
) -> FederationRound:
    """Round ``number``, open from ``now``; its deadline is round_seconds after ``clock_from`` (or now)."""
    deadline = (clock_from or now) + timedelta(seconds=float(federation.params["round_seconds"]))
    return FederationRound(
        federation_id=federation.id,
        number=number,
        status="open",
        opened_at=now,
        deadline=deadline,
        receipts=True,
    )


def to_public(session: Session, federation: Federation, principal: Principal) -> FederationPublic:
    params = federation.params
    regions = split_box([b[0] for b in params["bounds"]], [b[1] for b in params["bounds"]], int(params["P"]))
    agents = repo.agents(session, federation.id)
    public = [AgentPublic(id=a.id, name=a.name, position=a.position, region=a.region) for a in agents]
    deadline = None
    if federation.status == "running":
        current = repo.get_round(session, federation.id, federation.current_round)
        if current is not None and current.status == "open":
            deadline = current.deadline
    return FederationPublic(
        id=federation.id,
        created_at=federation.created_at,
        status=federation.status,  # type: ignore[arg-type]
        stop_reason=federation.stop_reason,  # type: ignore[arg-type]
        round=federation.current_round,
        round_deadline=deadline,
        rounds_closed=federation.rounds_closed,
        participants=federation.participants,
        epsilon_pld=federation.epsilon_pld,
        epsilon_rdp=federation.epsilon_rdp,
        epsilon_replace_one_pld=federation.epsilon_replace_one_pld,
        params=params,
        rff=federation.rff,
        region_counts=[int(c) for c in regions.counts],
        agents=public if principal.kind == "modeler" else None,
        you=next((a for a in public if a.id == principal.agent_id), None)
        if principal.kind == "agent"
        else None,
    )


def get_federation(session: Session, principal: Principal, federation_id: str) -> FederationPublic:
    return to_public(session, _federation_for(session, principal, federation_id), principal)


def request_digest(salt: str, omega: list[float]) -> str:
    """HMAC-SHA256 of a submission's body under a receipt's random salt: a receipt tells a retry from
    another omega under the same Idempotency-Key without keeping the omega (migration 0007 has a copy)."""
    canonical = json.dumps([float(v) for v in omega], separators=(",", ":"))
    return hmac.new(bytes.fromhex(salt), canonical.encode("utf-8"), hashlib.sha256).hexdigest()


def _accepted(
    federation_id: str, number: int, rnd: FederationRound, receipt: FederationReceipt
) -> SubmissionAccepted:
    return SubmissionAccepted(
        federation_id=federation_id,
        round=number,
        accepted_at=receipt.accepted_at,
        round_status="closed" if rnd.status == "closed" else "open",
    )


def submit(
    session: Session,
    principal: Principal,
    federation_id: str,
    number: int,
    omega: list[float],
    idempotency_key: str | None,
) -> tuple[SubmissionAccepted, bool]:
    """Store an agent's omega for round ``number`` and its receipt (returns the receipt and whether it was a
    replay of the same Idempotency-Key). One per agent per round; only to the open round before its
    deadline. A replay is answered from the receipt, also once the round has closed."""
    if principal.kind != "agent" or principal.agent_id is None:
        raise Forbidden("submissions need an agent token of this federation (the modeler does not submit)")
    agent_id = principal.agent_id
    federation = _federation_for(session, principal, federation_id)
    M = int(federation.params["M"])
    if len(omega) != M:
        raise Unprocessable(f"omega must have M = {M} values, got {len(omega)}")
    if not all(math.isfinite(v) for v in omega):
        raise Unprocessable("omega must be finite")
    # The round's row lock (PostgreSQL) orders this insert against the closer's conditional UPDATE: a
    # submission is either in the aggregate (and purged with the round; its receipt stays) or refused,
    # never left behind. It also orders two retries of one key: the second finds the first's receipt.
    rnd = repo.get_round(session, federation_id, number, for_update=True)
    if rnd is None:
        if federation.status == "registering":
            raise Conflict(f"federation {federation_id} has not started: no round is open")
        raise Conflict(f"round {number} is not open: the current round is {federation.current_round}")
    if idempotency_key is not None:
        keyed = repo.receipt_by_key(session, agent_id, idempotency_key)
        if keyed is not None:
            receipt, keyed_round = keyed
            if keyed_round != number:
                raise Conflict(
                    f"this Idempotency-Key was used for this agent's submission to round {keyed_round}; "
                    f"use a new key for round {number}"
                )
            if not hmac.compare_digest(receipt.request_digest, request_digest(receipt.request_salt, omega)):
                raise Conflict(
                    f"this Idempotency-Key was used for an accepted submission to round {number} with "
                    "another omega; a retry must send the same omega (one submission per round)"
                )
            return _accepted(federation_id, number, rnd, receipt), True
    existing = repo.receipt(session, rnd.id, agent_id)
    if existing is not None:
        raise Conflict(
            f"this agent has already submitted for round {number} (accepted at "
            f"{existing.accepted_at.isoformat()}; one submission per round)"
        )
    if rnd.status != "open":
        raise Conflict(
            f"round {number} is closed and holds no submission of this agent: the current round is "
            f"{federation.current_round}"
        )
    now = utcnow()
    if now >= rnd.deadline:
        raise Conflict(
            f"round {number}'s deadline passed at {rnd.deadline.isoformat()}: it closes without this "
            "submission (it counts as 0)"
        )
    repo.add(
        session,
        FederationSubmission(
            round_id=rnd.id,
            agent_id=agent_id,
            idempotency_key=idempotency_key,
            omega=[float(v) for v in omega],
            created_at=now,
        ),
    )
    salt = secrets.token_hex(16)
    receipt = FederationReceipt(
        round_id=rnd.id,
        agent_id=agent_id,
        idempotency_key=idempotency_key,
        request_salt=salt,
        request_digest=request_digest(salt, omega),
        accepted_at=now,
    )
    repo.add(session, receipt)
    return _accepted(federation_id, number, rnd, receipt), False


def read_round(session: Session, principal: Principal, federation_id: str, number: int) -> RoundPublic:
    """A round as the principal may see it: an agent also gets its own standing (``you``, its receipt)."""
    federation = _federation_for(session, principal, federation_id)
    rnd = repo.get_round(session, federation_id, number)
    if rnd is None:
        raise NotFound(
            f"federation {federation_id} has no round {number} (current round {federation.current_round})"
        )
    closed = rnd.status == "closed"
    you = None
    if principal.kind == "agent" and principal.agent_id is not None and rnd.receipts:
        receipt = repo.receipt(session, rnd.id, principal.agent_id)
        you = RoundStanding(
            accepted=receipt is not None, accepted_at=receipt.accepted_at if receipt is not None else None
        )
    return RoundPublic(
        round=rnd.number,
        status="closed" if closed else "open",
        deadline=rnd.deadline,
        participants=int(federation.participants or 0),
        aggregates=rnd.aggregates if closed else None,
        epsilon_pld=rnd.epsilon_pld if closed else None,
        epsilon_rdp=rnd.epsilon_rdp if closed else None,
        you=you,
    )


def read_round_tx(db: Database, principal: Principal, federation_id: str, number: int) -> RoundPublic:
    with transaction(db, write=False) as session:
        return read_round(session, principal, federation_id, number)


# -------------------------------------------------------------------------------------- closing a round


def close_round(
    db: Database,
    federation_id: str,
    number: int,
    *,
    now: datetime | None = None,
    rng: np.random.Generator | None = None,
) -> bool:
    """Close round ``number`` if it is open and past its deadline (at ``now``); True if this call closed it.

    The accounting is computed first, outside the write transaction (cached; seconds on a cold cache).
    Then one transaction: claim the round (conditional UPDATE open -> closed), Poisson sample, aggregate,
    epsilon, the next round opened or the federation done, the round's submissions deleted.
    """
    with transaction(db, write=False) as session:
        federation = repo.get_federation(session, federation_id)
        rnd = repo.get_round(session, federation_id, number)
        at = now or utcnow()
        if federation is None or rnd is None or rnd.status != "open" or rnd.deadline > at:
            return False
        params = dict(federation.params)
    q, z, delta, entries = accounting_params(params)
    rounds, budget = int(params["rounds"]), float(params["epsilon_budget"])
    eps = (epsilon_pld(q, z, number, delta, entries), epsilon_rdp(q, z, number, delta, entries))
    eps_replace_one = epsilon_replace_one(q, z, number, delta, entries)
    eps_next = epsilon_pld(q, z, number + 1, delta, entries) if number < rounds else math.inf

    with transaction(db) as session:
        rnd = repo.get_round(session, federation_id, number)
        closed_at = now or utcnow()
        if rnd is None or not repo.claim_round_for_close(session, rnd.id, closed_at):
            return False  # another closer got there first
        federation = repo.get_federation(session, federation_id, for_update=True)
        assert federation is not None  # noqa: S101 - the round's foreign key
        agents = sorted(
            (a for a in repo.agents(session, federation_id) if a.position is not None),
            key=lambda a: int(a.position or 0),
        )
        N = len(agents)
        position = {a.id: int(a.position or 0) for a in agents}
        submitted = {position[s.agent_id]: s.omega for s in repo.submissions(session, rnd.id)}
        rng = rng if rng is not None else os_entropy_rng()  # the sample and the noise: AES-CTR, OS-keyed
        sampled = poisson_sample(N, q, rng=rng)
        schedule = TemperatureSchedule.from_public(params["temperature"])
        aggregates = aggregate_round(
            N,
            submitted,
            sampled,
            M=int(params["M"]),
            P=int(params["P"]),
            S=float(params["S"]),
            q=q,
            z=z,
            temperature=schedule.temperature(number),
            rng=rng,
            assignment=np.asarray([int(a.region or 0) for a in agents], dtype=np.int64),
        )
        rnd.status, rnd.closed_at = "closed", closed_at
        rnd.sampled = [int(i) for i in np.flatnonzero(sampled)]
        rnd.aggregates = aggregates.tolist()
        rnd.epsilon_pld, rnd.epsilon_rdp = eps
        repo.purge_submissions(session, rnd.id)  # the raw omegas; the receipts stay
        federation.rounds_closed = number
        federation.epsilon_pld, federation.epsilon_rdp = eps
        federation.epsilon_replace_one_pld = eps_replace_one
        if number >= rounds:
            federation.status, federation.stop_reason = "done", "rounds"
        elif eps_next > budget:
            federation.status, federation.stop_reason = "done", "budget"
        else:
            federation.current_round = number + 1
            # the next round's time starts now, after the arithmetic: agents get all of round_seconds
            repo.add(session, _new_round(federation, number + 1, now or utcnow()))
        repo.touch(federation)
    log.info(
        "federation %s: round %d closed (epsilon %.4g PLD, %.4g RDP)%s",
        federation_id,
        number,
        eps[0],
        eps[1],
        f"; done ({federation.stop_reason})" if federation.status == "done" else "",
    )
    return True


def close_overdue(db: Database, *, now: datetime | None = None) -> int:
    """Close every open round past its deadline (the closer's pass; also at start-up). Returns how many."""
    with transaction(db, write=False) as session:
        due = repo.overdue_rounds(session, now or utcnow())
    return sum(close_round(db, federation_id, number, now=now) for federation_id, number in due)


def open_round_params(db: Database) -> list[tuple[dict[str, Any], int]]:
    """(params, number) of every open round (for warming the accounting caches)."""
    with transaction(db, write=False) as session:
        rounds = repo.open_rounds(session)
        out = []
        for federation_id, number in rounds:
            federation = repo.get_federation(session, federation_id)
            if federation is not None:
                out.append((dict(federation.params), number))
    return out
