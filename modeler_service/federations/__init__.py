"""Federations: the modeler as the coordinator of DP-FTS-DE (issue 16; ``API.md``, "Federations").

One feature package, like the studies:

* ``service`` — the use cases behind ``api/routes/federations.py`` and the closing of a round (no HTTP types);
* ``access`` — who calls: the modeler token, or an agent token of one federation;
* ``accounting`` — epsilon after t rounds (PLD, RDP, replace-one), cached;
* ``repository`` — every database query (nothing commits);
* ``closer`` — the background round closer (a thread of the modeler process; imported by ``main``).

The request and response bodies are the wire contract's: ``shared.protocol.schemas.federations``. The use
cases are re-exported here, so ``from modeler_service import federations; federations.close_round(...)``
keeps working.
"""

from __future__ import annotations

from modeler_service.federations.service import (
    check_first_round_at,
    close_overdue,
    close_round,
    create_federation,
    get_federation,
    list_federations,
    open_round_params,
    read_round,
    read_round_tx,
    register_agent,
    request_digest,
    start,
    submit,
    to_public,
)

__all__ = [
    "check_first_round_at",
    "close_overdue",
    "close_round",
    "create_federation",
    "get_federation",
    "list_federations",
    "open_round_params",
    "read_round",
    "read_round_tx",
    "register_agent",
    "request_digest",
    "start",
    "submit",
    "to_public",
]
