"""The curator's browser console at ``/console`` (admin only): the privacy officer's view.

Pages are added to the kit's router in ``pages``; the frame (sign-in, session, CSRF, headers, assets) is
``shared.servicekit.console``. Only the admin token signs in: a partner token is refused like any wrong
token (and counted by the throttle), so the console never renders anything for a partner.
"""

from __future__ import annotations

from pathlib import Path

from curator_service.config import Settings
from shared.errors import InputDataError, PrivacyBudgetExceeded
from shared.servicekit.console import Console

TEMPLATES = Path(__file__).parent / "templates"

NAV = [
    ("Overview", "/console"),
    ("Datasets", "/console/datasets"),
    ("Releases", "/console/releases"),
    ("Partners", "/console/partners"),
    ("Queries", "/console/queries"),
    ("Access log", "/console/access-log"),
]


def build_console(settings: Settings, admin_token: str) -> Console:
    """The curator console (its pages registered on its router)."""
    from curator_service.console import pages

    console = Console(
        service="curator",
        title="curator",
        templates=TEMPLATES,
        nav=NAV,
        operator_token=admin_token,
        session_minutes=settings.console_session_minutes,
        secure=settings.tls_enabled,
        who="curator's admin",
        operator="admin",
        library_errors={InputDataError: 422, PrivacyBudgetExceeded: 409},
    )
    pages.register(console)
    return console
