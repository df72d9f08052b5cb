"""Fast lanes: the one or two requests a service answers every iteration, taken past FastAPI's routing and
dependency solving when they are exactly the common case (issue 18).

A lane sits *inside* the whole middleware stack (CORS, the auth throttle, the access log, the body limit,
FastAPI's exception middleware: everything a request passes through stays as it is) and in front of the
router: ``install(app, lanes)`` wraps ``app.router.middleware_stack``, Starlette's router-level middleware
slot. For a request whose method and path match a lane, the lane's handler runs first. It either answers
(a response, or an exception that the exception middleware turns into the same error response the route
would give) or *declines*, having written nothing, and the request continues to the router and its
documented FastAPI route as if no lane existed; a declined request's body is handed on as it was read. The
routes stay the reference (and the OpenAPI documentation): a lane only ever takes the requests whose answer
it gives exactly as the route would, which the services' tests check pair by pair.

What a lane saves is the framework's work around a route that does a few milliseconds of its own: some
sixty route patterns tried in order, dependencies solved (one of them a hop to the thread pool), the body
validated through FastAPI's machinery. Measured in-process on the curator's query: 0.7 ms of 2.7 ms.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["Decline", "Lane", "LaneRequest", "bearer_token", "bypassed", "install", "json_content"]

#: A lane's handler: answers the request and returns True, or returns False having written nothing.
Handler = Callable[["LaneRequest", Send], Awaitable[bool]]


class Decline(Exception):
    """Raised by a handler (before it has written anything) for a request it does not take: the route gets
    it. Returning False means the same."""


@dataclass(frozen=True)
class Lane:
    """``method`` and a full-match ``path`` pattern (its groups are the path parameters), the ``handler``, and
    whether it needs the body (``read_body``; at most ``max_body`` bytes, else it declines unread).
    ``route``: the template of the route the lane stands in for, which the metrics count its requests under
    (``metrics``)."""

    method: str
    path: re.Pattern[str]
    handler: Handler
    read_body: bool = False
    max_body: int = 4096
    route: str | None = None


@dataclass
class LaneRequest:
    """What a handler sees: the scope, the path match, the body (empty unless the lane reads it) and the
    headers (names lower-case)."""

    scope: Scope
    match: re.Match[str]
    body: bytes
    receive: Receive

    def header(self, name: bytes) -> str | None:
        """The header's value (``name`` lower-case), or None when it is absent. A header sent more than once,
        or with bytes outside ASCII, is left to the route: :class:`Decline`."""
        found: bytes | None = None
        for key, value in self.scope["headers"]:
            if key == name:
                if found is not None:
                    raise Decline
                found = value
        if found is None:
            return None
        try:
            return found.decode("ascii")
        except UnicodeDecodeError as exc:
            raise Decline from exc

    @property
    def state(self) -> dict[str, Any]:
        """``request.state`` of the request (the access log's pending entry, the principal)."""
        state: dict[str, Any] = self.scope.setdefault("state", {})
        return state


def bearer_token(request: LaneRequest) -> str | None:
    """The token of ``Authorization: Bearer <token>``, parsed as FastAPI's ``HTTPBearer`` parses it, or None
    (no header, another scheme, no token): the route then answers its 401."""
    value = request.header(b"authorization")
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def json_content(request: LaneRequest) -> bool:
    """The body is declared JSON (``application/json``, with or without parameters)."""
    value = request.header(b"content-type")
    return value is not None and value.split(";", 1)[0].strip().lower() == "application/json"


class _Lanes:
    """The router's middleware slot: matching requests try their lane first."""

    def __init__(self, app: ASGIApp, lanes: Sequence[Lane]) -> None:
        self.app = app
        self.lanes = tuple(lanes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for lane in self.lanes:
                if scope["method"] != lane.method:
                    continue
                match = lane.path.fullmatch(scope["path"])
                if match is None:
                    continue
                await self._take(lane, match, scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _take(
        self, lane: Lane, match: re.Match[str], scope: Scope, receive: Receive, send: Send
    ) -> None:
        body = b""
        if lane.read_body:
            length = _content_length(scope)
            if length is None or length > lane.max_body:
                await self.app(scope, receive, send)  # unread: the route reads (and limits) it
                return
            body, receive = await _read_body(receive)
        if lane.route is not None:
            scope["pobo.lane_route"] = lane.route  # the router's own match replaces it if the lane declines
        try:
            taken = await lane.handler(LaneRequest(scope, match, body, receive), send)
        except Decline:
            taken = False
        if not taken:
            await self.app(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    values = [value for key, value in scope["headers"] if key == b"content-length"]
    if len(values) != 1 or not values[0].isdigit():
        return None
    return int(values[0])


async def _read_body(receive: Receive) -> tuple[bytes, Receive]:
    """The whole body, and a ``receive`` that hands the same messages on to the route (then the rest of the
    connection's messages, e.g. a disconnect)."""
    messages: list[Message] = []
    chunks: list[bytes] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break

    async def replay() -> Message:
        if messages:
            return messages.pop(0)
        return await receive()

    return b"".join(chunks), replay


def install(app: Any, lanes: Sequence[Lane]) -> None:
    """Put ``lanes`` in front of ``app``'s router (inside every middleware and the exception handlers)."""
    router = app.router
    router.middleware_stack = _Lanes(router.middleware_stack, lanes)


@contextmanager
def bypassed(app: Any) -> Iterator[None]:
    """``app`` as it would be without :func:`install` for the ``with`` block (the tests compare the lanes'
    answers with the routes')."""
    router = app.router
    lanes = router.middleware_stack
    if not isinstance(lanes, _Lanes):
        raise ValueError("the app has no lanes installed")
    router.middleware_stack = lanes.app
    try:
        yield
    finally:
        router.middleware_stack = lanes
