"""The modeler's browser console at ``/console``: studies (list, live progress, audit, run/step/stop, a
create form built from the strategies' parameter schemas) and federations (``pages_federations``: their
rounds, epsilon over the rounds, their agents) for the modeler's team.

Pages are added to the kit's router in ``pages``; the frame (sign-in, session, CSRF, headers, assets) is
``shared.servicekit.console``. Only the modeler token signs in (an agent token is refused like any wrong
token and counted by the throttle).
"""

from __future__ import annotations

from pathlib import Path

from modeler_service.config import Settings
from shared.errors import InputDataError, PoboError, StrategyError
from shared.servicekit.console import Console

TEMPLATES = Path(__file__).parent / "templates"

NAV = [
    ("Studies", "/console"),
    ("New study", "/console/studies/new"),
    ("Federations", "/console/federations"),
]


def build_console(settings: Settings, token: str) -> Console:
    """The modeler console (its pages registered on its router)."""
    from modeler_service.console import pages, pages_federations

    console = Console(
        service="modeler",
        title="modeler",
        templates=TEMPLATES,
        nav=NAV,
        operator_token=token,
        session_minutes=settings.console_session_minutes,
        secure=settings.tls_enabled,
        who="modeler's API",
        operator="modeler",
        library_errors={InputDataError: 422, StrategyError: 409, PoboError: 400},
    )
    pages.register(console)
    pages_federations.register(console)
    return console
