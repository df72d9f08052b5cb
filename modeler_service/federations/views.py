"""What the modeler's console shows of a federation (the coordinator's own view; no HTTP types): its rounds
(status, times, epsilon after each, how many submissions each accepted) and its agents with the last round
that accepted a submission of theirs. Never an omega, never a round's secret Poisson sample."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from modeler_service.federations import repository as repo
from modeler_service.federations.access import MODELER
from modeler_service.federations.service import get_federation
from shared.protocol.schemas.federations import FederationPublic


@dataclass(frozen=True)
class RoundRow:
    number: int
    status: str
    opened_at: datetime
    deadline: datetime
    closed_at: datetime | None
    epsilon_pld: float | None
    epsilon_rdp: float | None
    accepted: int | None  # submissions accepted (None: a round closed before the modeler kept receipts)


@dataclass(frozen=True)
class AgentRow:
    id: str
    name: str
    seq: int
    position: int | None
    region: int | None
    created_at: datetime
    last_round: int | None  # the last round that accepted a submission of this agent
    rounds_accepted: int


@dataclass(frozen=True)
class FederationDetail:
    federation: FederationPublic
    rounds: list[RoundRow]
    agents: list[AgentRow]


def federation_detail(session: Session, federation_id: str) -> FederationDetail:
    """A federation (404 if none), its rounds in order and its agents in registration order."""
    public = get_federation(session, MODELER, federation_id)
    accepted = repo.receipts_per_round(session, federation_id)
    rounds = [
        RoundRow(
            number=r.number,
            status=r.status,
            opened_at=r.opened_at,
            deadline=r.deadline,
            closed_at=r.closed_at,
            epsilon_pld=r.epsilon_pld,
            epsilon_rdp=r.epsilon_rdp,
            accepted=accepted.get(r.number, 0) if r.receipts else None,
        )
        for r in repo.rounds(session, federation_id)
    ]
    last = repo.agents_last_round(session, federation_id)
    agents = [
        AgentRow(
            id=a.id,
            name=a.name,
            seq=a.seq,
            position=a.position,
            region=a.region,
            created_at=a.created_at,
            last_round=last[a.id][0] if a.id in last else None,
            rounds_accepted=last[a.id][1] if a.id in last else 0,
        )
        for a in repo.agents(session, federation_id)
    ]
    return FederationDetail(public, rounds, agents)
