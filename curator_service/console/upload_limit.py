"""The console's CSV upload (``POST /console/datasets``) obeys the upload limit, not the JSON body limit.

Like the API's ``UploadGuard`` for ``POST /v1/datasets``, the body may be as large as
``max_upload_bytes`` plus the multipart framing, and no larger: a body that announces more, or streams more,
is refused *while it is read* with an HTML 413 page. The refusal is raised from ``receive`` as a
``ConsoleRefusal``, so it surfaces inside the form parsing of the route (after the session check: a browser
without a session gets its 403 before anything is read) and the console route renders it as a page.
Nothing of the upload is stored: the dataset service never runs.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared.servicekit.console import ConsoleRefusal

UPLOAD_PATH = "/console/datasets"


class ConsoleUploadLimit:
    """Plain ASGI: caps the body of ``POST /console/datasets`` at ``max_bytes`` (``max_upload_bytes`` + the
    multipart slack); ``max_upload_bytes`` is quoted in the message."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, max_upload_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.message = (
            f"the upload is larger than the limit of {max_upload_bytes} bytes "
            "(setting POBO_CURATOR_MAX_UPLOAD_BYTES): nothing was stored"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"].rstrip("/") != UPLOAD_PATH:
            await self.app(scope, receive, send)
            return
        try:
            announced = int(Headers(scope=scope).get("content-length", "-1"))
        except ValueError:
            announced = -1
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            if announced > self.max_bytes:
                raise ConsoleRefusal(413, self.message)
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise ConsoleRefusal(413, self.message)
            return message

        await self.app(scope, limited_receive, send)
