"""The modeler console's pages (routers -> the same service functions as the API)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import HTMLResponse

from shared.servicekit.console import Console, SignedIn


def register(console: Console) -> None:
    router = console.router

    @router.get("")
    def studies(request: Request, session: SignedIn) -> HTMLResponse:
        return console.render(request, "studies.html", {}, session=session)
