"""Who is calling a service: the principal a bearer token stands for, one shape for both services.

The curator's principals are ``admin`` (its admin token) and ``partner`` (a partner token, ``partner_id``
set); the modeler's federation endpoints know ``modeler`` (its own token) and ``agent`` (an agent token of
one federation, ``agent_id`` and ``federation_id`` set). Each service authenticates its tokens itself
(``shared.servicekit.tokens`` hashes them); this is only what the answer looks like.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Principal"]


@dataclass(frozen=True)
class Principal:
    """Who is calling: a ``kind`` ("admin", "partner", "modeler", "agent") and the ids that kind needs."""

    kind: str
    partner_id: int | None = None  # a curator partner
    agent_id: str | None = None  # a modeler federation agent ...
    federation_id: str | None = None  # ... and its federation

    @property
    def is_admin(self) -> bool:
        return self.kind == "admin"

    @property
    def actor(self) -> str:
        """How a log names the caller: the kind, with the caller's id when it has one (``partner:3``)."""
        if self.partner_id is not None:
            return f"{self.kind}:{self.partner_id}"
        if self.agent_id is not None:
            return f"{self.kind}:{self.agent_id}"
        return self.kind
