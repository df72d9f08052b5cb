"""``shared.servicekit.lanes``: a lane answers the requests it takes, inside the app's middleware and
exception handlers, and hands every other request to the router with its body as sent."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from starlette.responses import Response
from starlette.types import Send

from shared.servicekit.lanes import Decline, Lane, LaneRequest, bearer_token, install, json_content

pytestmark = pytest.mark.anyio


class Teapot(Exception):
    pass


def make_app() -> tuple[FastAPI, list[str]]:
    """A route ``POST /items/{id}`` that echoes what it got, and a lane in front of it that takes only
    ``{"take": true}`` bodies with the bearer token ``t``. ``seen`` records who answered."""
    seen: list[str] = []
    app = FastAPI()

    @app.exception_handler(Teapot)
    async def teapot(_: Request, exc: Teapot) -> JSONResponse:
        return JSONResponse({"detail": "teapot"}, status_code=418)

    @app.middleware("http")
    async def stamp(request: Request, call_next: Any) -> Any:
        response = await call_next(request)
        response.headers["x-stamped"] = "yes"  # the lane's answers pass the middleware too
        return response

    @app.post("/items/{item_id}")
    async def route(item_id: int, request: Request) -> dict[str, Any]:
        seen.append("route")
        return {"by": "route", "id": item_id, "body": (await request.body()).decode()}

    async def handle(request: LaneRequest, send: Send) -> bool:
        if bearer_token(request) != "t" or not json_content(request):
            return False
        if request.header(b"x-raise") is not None:
            raise Teapot
        if request.body != b'{"take": true}':
            raise Decline
        seen.append("lane")
        body = b'{"by": "lane", "id": %s}' % request.match.group(1).encode()
        await Response(body, media_type="application/json")(request.scope, request.receive, send)
        return True

    install(app, [Lane("POST", re.compile(r"/items/([0-9]+)"), handle, read_body=True, max_body=64)])
    return app, seen


async def post(app: FastAPI, path: str, body: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        base = {"Authorization": "Bearer t", "Content-Type": "application/json"}
        return await client.post(path, content=body, headers=base | (headers or {}))


async def test_the_lane_answers_what_it_takes_inside_the_middleware() -> None:
    app, seen = make_app()
    response = await post(app, "/items/7", b'{"take": true}')
    assert response.json() == {"by": "lane", "id": 7} and response.headers["x-stamped"] == "yes"
    assert seen == ["lane"]


@pytest.mark.parametrize(
    ("path", "body", "headers"),
    [
        ("/items/7", b'{"take": false}', {}),  # the handler declines (raise Decline)
        ("/items/7", b'{"take": true}', {"Authorization": "Bearer other"}),  # returns False
        ("/items/7", b'{"take": true}', {"Content-Type": "text/plain"}),
        ("/items/7", b'{"take": true, "pad": "' + b"x" * 64 + b'"}', {}),  # over max_body: not read
        ("/items/7/", b'{"take": true}', {}),  # not the lane's path
    ],
)
async def test_a_declined_request_reaches_the_route_with_its_body(
    path: str, body: bytes, headers: dict[str, str]
) -> None:
    app, seen = make_app()
    response = await post(app, path, body, headers)
    if path.endswith("/"):
        assert response.status_code in (307, 404) and seen == []
        return
    assert response.status_code == 200 and response.json()["body"] == body.decode()
    assert response.json()["by"] == "route" and seen == ["route"]


async def test_a_header_sent_twice_is_left_to_the_route() -> None:
    app, seen = make_app()
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        headers = [
            ("Authorization", "Bearer t"),
            ("Authorization", "Bearer t"),
            ("Content-Type", "application/json"),
        ]
        response = await client.post("/items/3", content=b'{"take": true}', headers=headers)
    assert response.json()["by"] == "route" and seen == ["route"]


async def test_an_error_in_the_lane_gets_the_apps_exception_handler() -> None:
    app, seen = make_app()
    response = await post(app, "/items/7", b'{"take": true}', {"X-Raise": "1"})
    assert response.status_code == 418 and response.json() == {"detail": "teapot"} and seen == []


async def test_other_methods_and_http_exceptions_are_untouched() -> None:
    app, _ = make_app()

    @app.get("/boom")
    async def boom() -> None:
        raise HTTPException(409, "no")

    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        assert (await client.get("/items/7")).status_code == 405
        assert (await client.get("/boom")).json() == {"detail": "no"}
